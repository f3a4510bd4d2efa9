"""Static target cache + per-row attention, checked against stock transformers forwards."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2.engine import ATTN_IMPLEMENTATION, StaticTargetCache, row_attention, static_attention
from dflash2.target import cache_keyword
from tests.engine.helpers import DTYPE, llama_target, qwen3_target


def naive_attention(q, k, v, pos, window, scale):
    """Explicit softmax attention with the documented visibility rule (per row, per query)."""
    b, nh, nq, hd = q.shape
    rep = nh // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = torch.empty_like(q)
    for r in range(b):
        for i in range(nq):
            j = torch.arange(k.shape[2])
            vis = j <= pos[r, i]
            if window:
                vis &= j > pos[r, i] - window
            s = torch.einsum("hd,hjd->hj", q[r, :, i], k[r]) * scale  # [nh, kv]
            s = s.masked_fill(~vis, -math.inf)
            out[r, :, i] = torch.einsum("hj,hjd->hd", torch.softmax(s, -1), v[r])
    return out.transpose(1, 2)


@pytest.mark.parametrize("window", [None, 3])
def test_row_attention_matches_naive(window):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 8, generator=g, dtype=DTYPE)
    k = torch.randn(3, 2, 12, 8, generator=g, dtype=DTYPE)
    v = torch.randn(3, 2, 12, 8, generator=g, dtype=DTYPE)
    pos = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [2, 3, 4, 5, 6]])  # rows at different offsets
    module = torch.nn.Module()
    got, w = row_attention(module, q, k, v, None, scaling=0.3, sliding_window=window, position_ids=pos)
    assert w is None and got.shape == (3, 5, 4, 8)
    torch.testing.assert_close(got, naive_attention(q, k, v, pos, window, 0.3))


def test_row_attention_refuses_missing_positions_or_hf_mask():
    q = torch.zeros(1, 2, 1, 4)
    kv = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="position_ids"):
        row_attention(torch.nn.Module(), q, kv, kv, None)
    with pytest.raises(RuntimeError, match="mask"):
        row_attention(torch.nn.Module(), q, kv, kv, torch.zeros(1, 1, 1, 3),
                      position_ids=torch.zeros(1, 1, dtype=torch.long))


@pytest.mark.parametrize("factory", [qwen3_target, lambda: qwen3_target(sliding=True), llama_target],
                         ids=["qwen3", "qwen3-sliding", "llama"])
def test_rows_write_at_own_offsets_and_roll_back(factory):
    """Prefill rows of different lengths, write a speculative block, roll back part of it,
    write a different block: every logit equals a cache-free stock forward of the same row."""
    model = factory()
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    seqs = [torch.randint(0, vocab, (n,), generator=g) for n in (5, 9, 2)]
    bsz, p_max = len(seqs), 9
    cache = StaticTargetCache(model.config, bsz, 32, DTYPE, "cpu")
    assert len(cache.layers) == model.config.num_hidden_layers and cache.get_max_length() == 32
    ids = torch.zeros(bsz, p_max, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = s
    lens = torch.tensor([len(s) for s in seqs])

    def check(logits, rows_tokens):
        for b, toks in enumerate(rows_tokens):
            with torch.no_grad():
                ref = model(input_ids=toks[None]).logits[0, -logits.shape[1]:]
            torch.testing.assert_close(logits[b], ref, rtol=1e-9, atol=1e-9)

    with torch.no_grad(), static_attention(model):
        pos = torch.arange(p_max)[None].expand(bsz, -1)
        cache.prepare(pos)
        out = model(input_ids=ids, position_ids=pos, **{cache_keyword(model): cache}).logits
        for b, s in enumerate(seqs):
            check(out[b : b + 1, : len(s)], [s])
        cache.set_lengths(lens)
        # a 4-token block per row at its own offset
        block = torch.randint(0, vocab, (bsz, 4), generator=g)
        pos = lens[:, None] + torch.arange(4)
        cache.prepare(pos, kv_len=int(pos.max()) + 1)
        out = model(input_ids=block, position_ids=pos, **{cache_keyword(model): cache}).logits
        check(out, [torch.cat([s, block[b]]) for b, s in enumerate(seqs)])
        # keep 0, 2 and 3 tokens of the block per row (rollback = new lengths), then a new block
        keep = torch.tensor([0, 2, 3])
        cache.set_lengths(lens + keep)
        assert cache.get_seq_length() == int((lens + keep).max())
        block2 = torch.randint(0, vocab, (bsz, 3), generator=g)
        pos = (lens + keep)[:, None] + torch.arange(3)
        cache.prepare(pos)
        out = model(input_ids=block2, position_ids=pos, **{cache_keyword(model): cache}).logits
        check(out, [torch.cat([s, block[b, : keep[b]], block2[b]]) for b, s in enumerate(seqs)])


def test_static_attention_restores_implementation():
    model = qwen3_target(vocab=16)
    before = model.config._attn_implementation
    with pytest.raises(KeyError):
        with static_attention(model):
            assert model.config._attn_implementation == ATTN_IMPLEMENTATION
            raise KeyError("boom")
    assert model.config._attn_implementation == before


def test_prepare_is_required():
    model = qwen3_target(vocab=16)
    cache = StaticTargetCache(model.config, 1, 8, DTYPE, "cpu")
    with torch.no_grad(), static_attention(model), pytest.raises(RuntimeError, match="prepare"):
        model(input_ids=torch.zeros(1, 2, dtype=torch.long), position_ids=torch.arange(2)[None],
              **{cache_keyword(model): cache})
