"""Anchors, block layout and the training mask (spec 3.2-3.4, 2.5)."""

import torch

from dflash2.modeling import DFlash2DraftModel
from dflash2.training.layout import (anchor_seed, build_layout, dense_mask, eligible_anchors, flex_block_mask,
                                     sample_anchors)
from tests.conftest import randomize_, tiny_draft_config
from tests.training.distill_helpers import synthetic_data


def _batch(samples):
    from dflash2.training.data import collate

    return collate(samples)


def test_anchors_are_eligible_sorted_unique_and_keyed_by_seed_epoch_index():
    s = synthetic_data(n=1, length=40).train[0]
    ok = eligible_anchors(s["loss_mask"], s["doc_ids"])
    a, v = sample_anchors(s["loss_mask"], s["doc_ids"], 10, torch.Generator().manual_seed(anchor_seed(0, 0, 3)))
    assert v.all() and ok[a].all() and (a[1:] > a[:-1]).all()
    a2, _ = sample_anchors(s["loss_mask"], s["doc_ids"], 10, torch.Generator().manual_seed(anchor_seed(0, 0, 3)))
    a3, _ = sample_anchors(s["loss_mask"], s["doc_ids"], 10, torch.Generator().manual_seed(anchor_seed(0, 1, 3)))
    assert torch.equal(a, a2) and not torch.equal(a, a3)        # fresh each epoch, reproducible
    # More anchors than eligible positions: all of them, the rest invalid.
    a, v = sample_anchors(s["loss_mask"], s["doc_ids"], 64, torch.Generator().manual_seed(1))
    assert int(v.sum()) == int(ok.sum()) and set(a[v].tolist()) == set(torch.nonzero(ok).flatten().tolist())


def test_layout_labels_stay_inside_the_document():
    s = synthetic_data(n=1, length=40).train[0]
    b = _batch([s])
    doc_end = int((s["doc_ids"] == 0).sum())                   # first document ends here
    anchors = torch.tensor([[doc_end - 3, 20, 0]])
    valid = torch.tensor([[True, True, False]])
    lay = build_layout(b["input_ids"], b["loss_mask"], b["position_ids"], b["doc_ids"], anchors, valid, 8, 299)
    assert lay.label_mask[0, 0].tolist() == [False, True, True] + [False] * 5   # stops at the doc end
    assert not lay.label_mask[0, 2].any() and not lay.label_mask[:, :, 0].any()
    assert lay.block_ids[0, 1, 0] == b["input_ids"][0, 20] and (lay.block_ids[0, :, 1:] == 299).all()
    assert lay.block_pos[0, 1].tolist() == [int(b["position_ids"][0, 20]) + i for i in range(8)]
    assert lay.pred_ids[0, 1, 1:].tolist() == b["input_ids"][0, 20:27].tolist()


def test_packed_forward_equals_one_block_at_a_time():
    """The flattened layout with its mask computes, for every block, exactly what the draft
    computes for that block alone with the document's context before the anchor."""
    torch.manual_seed(0)
    cfg = tiny_draft_config(vocab=300, block_size=8)
    draft = randomize_(DFlash2DraftModel(cfg), seed=1, std=0.05).eval()
    data = synthetic_data(n=2, length=40)
    b = _batch(data.train[:2])
    S, H = b["input_ids"].shape[1], cfg.hidden_size
    feats = torch.randn(2, S, 2 * H)
    anchors = torch.tensor([[3, 9, 30], [5, 20, 0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    lay = build_layout(b["input_ids"], b["loss_mask"], b["position_ids"], b["doc_ids"], anchors, valid, 8, 299)
    emb = torch.nn.Embedding(300, H)
    mask = dense_mask(lay, b["doc_ids"], b["position_ids"], cfg)
    pos = torch.cat([b["position_ids"], lay.block_pos.flatten(1)], 1)
    with torch.no_grad():
        packed = draft(pos, emb(lay.block_ids.flatten(1)), feats, attention_mask=mask, block_len=8).view(2, 3, 8, H)
        flex = draft(pos, emb(lay.block_ids.flatten(1)), feats, block_len=8,
                     attention_mask=flex_block_mask(lay, b["doc_ids"], b["position_ids"], cfg)).view(2, 3, 8, H)
        for r in range(2):
            for j in range(3):
                if not valid[r, j]:
                    continue
                p = int(anchors[r, j])
                ctx = [k for k in range(p) if b["doc_ids"][r, k] == b["doc_ids"][r, p]]
                one = draft(torch.cat([b["position_ids"][r, ctx], lay.block_pos[r, j]])[None],
                            emb(lay.block_ids[r, j])[None], feats[r, ctx][None])
                torch.testing.assert_close(packed[r, j], one[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flex[valid], packed[valid], rtol=1e-5, atol=1e-5)


def test_mask_hides_the_anchor_feature_and_other_blocks():
    cfg = tiny_draft_config(vocab=300, block_size=4)
    b = _batch(synthetic_data(n=1, length=30).train[:1])
    lay = build_layout(b["input_ids"], b["loss_mask"], b["position_ids"], b["doc_ids"],
                       torch.tensor([[7, 15]]), torch.tensor([[True, True]]), 4, 299)
    m = dense_mask(lay, b["doc_ids"], b["position_ids"], cfg)[0, 0]     # [8, S + 8]
    S = b["input_ids"].shape[1]
    assert m[0, :7].all() and not m[0, 7:S].any()               # context strictly before the anchor
    doc_start = int((b["doc_ids"][0] == 0).sum())               # 2nd anchor (15) is in document 1
    assert not m[4, :doc_start].any() and m[4, doc_start:15].all()
    assert m[0, S:S + 4].all() and not m[0, S + 4:].any()       # own block only, bidirectional
