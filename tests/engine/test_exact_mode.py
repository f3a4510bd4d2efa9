"""Exact mode on the CPU: the bookkeeping (padded blocks, row-wise prefill, full K/V view) and
the equalities it promises, on tiny random targets.

The bf16-on-GPU proof (Qwen3-8B shape, peaked head, batch 8, a failing control with
exact=False) is `tests/gpu/test_exact_mode.py`; here the kernels are CPU ones, so these tests
check that exact mode computes the same tokens as the normal path (fp64), that its speculative
output equals its AR output and each batch row equals the row run alone, and that every target
forward after prefill really has the padded width and every prefill a batch of one.
"""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.engine.inputs import GenerateInputError
from dflash2.evaluation.arms.oracle_proposers import OracleProposer
from tests.engine.helpers import prompts, qwen3_target, random_draft

BLOCK = 10
MAX_NEW = 14


def _shapes(model):
    """Record (batch, width) of every forward of the HF model."""
    seen = []
    handle = model.register_forward_pre_hook(lambda _m, args, kw: seen.append(tuple(kw["input_ids"].shape)),
                                             with_kwargs=True)
    return seen, handle


@pytest.fixture(scope="module")
def setup():
    target = qwen3_target(head_scale=4.0)
    rows = [prompts()[i] for i in (0, 2, 6, 15)]  # lengths differ: padding/prefill paths differ per row
    ar = speculative_generate(target, None, rows, max_new_tokens=MAX_NEW, exact=True, exact_block_size=BLOCK)
    return target, rows, ar


def _oracle(rows, ar, accept_prob=0.9):
    return OracleProposer([s.tolist() for s in ar.sequences], seeds=list(range(len(rows))), block_size=BLOCK,
                          accept_prob=accept_prob, vocab_size=qwen3_target().config.vocab_size)


def test_exact_mode_matches_the_normal_path_in_fp64(setup):
    target, rows, ar = setup
    plain = speculative_generate(target, None, rows, max_new_tokens=MAX_NEW)
    for a, b in zip(ar.sequences, plain.sequences):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n_spec", [1, 3, 9])
def test_exact_speculative_equals_exact_ar_and_rows_equal_alone(setup, n_spec):
    target, rows, ar = setup
    oracle = _oracle(rows, ar)
    spec = speculative_generate(target, oracle, rows, max_new_tokens=MAX_NEW, num_speculative_tokens=n_spec,
                                exact=True)
    mean_acc = sum(map(sum, spec.accepted)) / sum(map(len, spec.accepted))
    assert mean_acc >= (0.5 if n_spec == 1 else 1.0), mean_acc  # the oracle really accepts (not a trivial equality)
    for a, b in zip(spec.sequences, ar.sequences):
        assert torch.equal(a, b)
    # Each row alone (batch of one, its own seed/oracle row) gives the batch row's tokens.
    for b, r in enumerate(rows):
        alone_oracle = OracleProposer([ar.sequences[b].tolist()], seeds=[b], block_size=BLOCK, accept_prob=0.9,
                                      vocab_size=target.config.vocab_size)
        alone = speculative_generate(target, alone_oracle, [r], max_new_tokens=MAX_NEW,
                                     num_speculative_tokens=n_spec, exact=True)
        assert torch.equal(alone.sequences[0], spec.sequences[b])
        assert alone.accepted[0] == spec.accepted[b]


def test_every_forward_is_one_row_and_every_block_has_the_padded_width():
    target = qwen3_target()
    rows = [prompts()[i] for i in (1, 4, 7)]
    draft = random_draft(block_size=BLOCK)
    seen, handle = _shapes(target)
    try:
        out = speculative_generate(target, draft, rows, max_new_tokens=6, num_speculative_tokens=3, exact=True)
    finally:
        handle.remove()
    prefill, steps = seen[: len(rows)], seen[len(rows):]
    assert prefill == [(1, r.numel()) for r in rows]  # row by row, own length
    assert steps and all(s == (1, BLOCK) for s in steps)  # row by row, the draft's block_size
    assert len(steps) == len(rows) * max(map(len, out.accepted))  # finished rows ride along


def test_sampled_exact_rows_equal_alone(setup):
    target, rows, ar = setup
    seeds = [11, 12, 13, 14]
    kw = dict(max_new_tokens=MAX_NEW, num_speculative_tokens=5, temperature=0.9, exact=True)
    batch = speculative_generate(target, random_draft(block_size=BLOCK), rows, seed=seeds, **kw)
    for b, r in enumerate(rows):
        alone = speculative_generate(target, random_draft(block_size=BLOCK), [r], seed=[seeds[b]], **kw)
        assert torch.equal(alone.sequences[0], batch.sequences[b])


def test_exact_block_size_must_hold_the_verify_block():
    target = qwen3_target()
    with pytest.raises(GenerateInputError, match="exact_block_size"):
        speculative_generate(target, random_draft(block_size=BLOCK), [prompts()[0]], max_new_tokens=4,
                             num_speculative_tokens=9, exact=True, exact_block_size=4)
    with pytest.raises(GenerateInputError, match="exact"):
        speculative_generate(target, None, [prompts()[0]], max_new_tokens=4, exact="yes")


def test_exact_ar_without_a_width_is_refused_not_defaulted():
    """An exact AR run is bit-identical only to speculative runs of its padded width, which it
    cannot know without a draft: no silent default."""
    target = qwen3_target()
    with pytest.raises(GenerateInputError, match="exact_block_size: is not given.*pass exact_block_size=W"):
        speculative_generate(target, None, [prompts()[0]], max_new_tokens=4, exact=True)
    # Outside exact mode the width is unused, and a draft's block_size is its default in exact mode.
    speculative_generate(target, None, [prompts()[0]], max_new_tokens=2)
    speculative_generate(target, random_draft(block_size=BLOCK), [prompts()[0]], max_new_tokens=2,
                         num_speculative_tokens=3, exact=True)


def test_bucketed_kv_length_changes_no_token(monkeypatch):
    """Normal mode rounds attention's K/V length up to a bucket on CUDA; the masked tail must
    change nothing. Forced on CPU here (fp64): same tokens with and without the bucket."""
    import dflash2.engine.generate as gen

    target = qwen3_target()
    rows = [prompts()[i] for i in (0, 3, 5)]
    draft = random_draft(block_size=BLOCK)
    plain = speculative_generate(target, draft, rows, max_new_tokens=10, num_speculative_tokens=4)
    monkeypatch.setattr(gen, "CPU_KV_BUCKET", 16)
    lengths = []
    from dflash2.engine.cache import StaticTargetCache

    prepare = StaticTargetCache.prepare

    def spy(self, positions, kv_len=None, row=None, rows=None, start=0):
        lengths.append((positions.shape[1], kv_len))
        return prepare(self, positions, kv_len, row, rows, start)

    monkeypatch.setattr(StaticTargetCache, "prepare", spy)
    bucketed = speculative_generate(target, draft, rows, max_new_tokens=10, num_speculative_tokens=4)
    steps = [k for q, k in lengths if q == 5]  # the verify forwards (1 + N slots)
    assert steps and all(k % 16 == 0 for k in steps)  # the bucket was applied
    for a, b in zip(plain.sequences, bucketed.sequences):
        assert torch.equal(a, b)
    assert plain.accepted == bucketed.accepted


def test_prefill_length_rounds_within_the_states_slots():
    from dflash2.engine.prefill import prefill_length

    assert prefill_length(150, 512, 64) == 192
    assert prefill_length(192, 512, 64) == 192       # already a multiple
    assert prefill_length(150, 160, 64) == 160       # never past the state's slots
    assert prefill_length(150, 512, 0) == 150        # 0: exact lengths


def test_padded_prefill_changes_no_token(monkeypatch):
    """Normal mode pads the prefill forward to a bucket of lengths on CUDA (one attention plan per
    bucket, not per prompt length); the padded slots must change nothing. Forced on CPU here
    (fp64): the prefill really runs padded, and AR and speculative tokens equal the unpadded run's."""
    import dflash2.engine.generate as gen
    from dflash2.engine.cache import StaticTargetCache

    target = qwen3_target()
    rows = [prompts()[i] for i in (0, 3, 5)]
    draft = random_draft(block_size=BLOCK)
    plain_ar = speculative_generate(target, None, rows, max_new_tokens=10)
    plain = speculative_generate(target, draft, rows, max_new_tokens=10, num_speculative_tokens=4)
    monkeypatch.setattr(gen, "CPU_PREFILL_BUCKET", 16)
    widths = []
    prepare = StaticTargetCache.prepare

    def spy(self, positions, kv_len=None, row=None, rows=None, start=0):
        widths.append(positions.shape[1])
        return prepare(self, positions, kv_len, row, rows, start)

    monkeypatch.setattr(StaticTargetCache, "prepare", spy)
    padded_ar = speculative_generate(target, None, rows, max_new_tokens=10)
    padded = speculative_generate(target, draft, rows, max_new_tokens=10, num_speculative_tokens=4)
    p_max = max(len(r) for r in rows)
    assert p_max % 16 and widths.count(gen.round_up(p_max, 16)) == 2  # each call's prefill ran padded
    for a, b in zip(plain_ar.sequences + plain.sequences, padded_ar.sequences + padded.sequences):
        assert torch.equal(a, b)
    assert plain.accepted == padded.accepted
