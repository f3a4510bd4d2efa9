"""TargetModel: features equal HF hidden_states[i+1]; embeddings/head; loaders; compatibility."""

from __future__ import annotations

import pytest
import torch

from dflash2 import DFlash2ConfigError, TargetModel
from dflash2.target import as_target
from tests.conftest import tiny_draft_config, tiny_llama, tiny_qwen3


@pytest.mark.parametrize("factory", [tiny_qwen3, tiny_llama], ids=["qwen3", "llama"])
def test_features_equal_hf_hidden_states(factory):
    hf = factory()
    target = TargetModel(hf, layer_ids=[0, 2])
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True)
        out = target(ids)
    want = torch.cat([ref.hidden_states[1], ref.hidden_states[3]], dim=-1)
    assert out.features.shape == (2, 9, 2 * 64)
    assert torch.equal(out.features, want)
    assert torch.equal(out.logits, ref.logits)
    # Other layer ids on the same wrapper, and logits_to_keep.
    with torch.no_grad():
        out = target(ids, layer_ids=[3], logits_to_keep=1)
    assert torch.equal(out.features, ref.hidden_states[4])
    assert out.logits.shape == (2, 1, 300)


def test_embed_and_head_are_the_targets():
    hf = tiny_qwen3()
    target = TargetModel(hf)
    ids = torch.tensor([[1, 5, 7]])
    assert torch.equal(target.embed(ids), hf.model.embed_tokens(ids))
    h = torch.randn(1, 3, 64)
    assert torch.equal(target.head(h), hf.lm_head(h))
    assert target.lm_head_weight is hf.lm_head.weight
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (4, 64, 300)


def test_embed_reads_rows_of_a_plain_table_and_calls_any_other_module(monkeypatch):
    # A plain nn.Embedding is read as weight[ids] (one gather; F.embedding's bits); a subclass
    # (e.g. a scaled embedding) or a table being trained goes through the module itself.
    hf = tiny_qwen3()
    target = TargetModel(hf)
    ids = torch.tensor([[1, 5, 7], [0, 299, 5]])
    calls = []
    emb = hf.model.embed_tokens
    monkeypatch.setattr(emb, "forward", lambda x: calls.append(1) or torch.nn.functional.embedding(x, emb.weight))
    with torch.no_grad():
        assert torch.equal(target.embed(ids), torch.nn.functional.embedding(ids, emb.weight)) and not calls
    assert emb.weight.requires_grad
    target.embed(ids)  # grad mode on and the table trainable: the module
    assert calls == [1]

    class Scaled(torch.nn.Embedding):
        def forward(self, x):
            return super().forward(x) * 2.0

    scaled = Scaled(300, 64)
    hf.model.embed_tokens = scaled
    with torch.no_grad():
        assert torch.equal(target.embed(ids), scaled.weight[ids] * 2.0)


def test_layer_ids_out_of_range_raise():
    target = TargetModel(tiny_qwen3())
    with pytest.raises(ValueError, match=r"layer_ids \[4\]"):
        target(torch.tensor([[1, 2]]), layer_ids=[4])


def test_check_compatible_explains_mismatch():
    target = TargetModel(tiny_qwen3())
    target.check_compatible(tiny_draft_config())
    with pytest.raises(DFlash2ConfigError, match="vocab_size"):
        target.check_compatible(tiny_draft_config(vocab=301, mask_token_id=5))
    with pytest.raises(DFlash2ConfigError, match="target_layer_ids"):
        target.check_compatible(tiny_draft_config(target_layer_ids=[1, 7]))
    big = tiny_draft_config(hidden=128)
    with pytest.raises(DFlash2ConfigError, match="hidden_size"):
        target.check_compatible(big)


def test_as_target_wraps_once():
    hf = tiny_qwen3()
    t1, t2 = as_target(hf, [0]), as_target(hf, [1])
    assert t1 is t2 and t2.layer_ids == [1]


def test_local_directory_round_trip(tmp_path):
    hf = tiny_qwen3()
    hf.save_pretrained(tmp_path)
    target = TargetModel.from_pretrained(tmp_path, layer_ids=[1])
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        assert torch.equal(target(ids).logits, hf(ids).logits)


def test_real_smollm2_gguf_target_loads_offline():
    from dflash2.assets import smollm2_gguf

    try:
        d, name = smollm2_gguf()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    target = TargetModel.from_pretrained(d / name, layer_ids=[1, 15])  # path to the .gguf file itself
    assert (target.num_layers, target.hidden_size, target.vocab_size) == (30, 576, 49152)
    with torch.no_grad():
        out = target(torch.tensor([[1, 504, 3458, 314]]))
    assert out.features.shape == (1, 4, 2 * 576) and torch.isfinite(out.logits).all()
