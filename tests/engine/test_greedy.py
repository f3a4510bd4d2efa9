"""Greedy losslessness: speculative == AR through the same loop == transformers `generate`.

Targets are tiny random Qwen3 / Llama models in fp64 with the real Qwen3 tokenizer's
vocabulary; equality is exact, token for token. A random draft accepts almost nothing
(equality under constant rejection); the greedy oracle accepts everything (equality under
long accepted runs, stop tokens and length caps landing inside them).
"""

from __future__ import annotations

import functools

import pytest
import torch

from dflash2.engine import speculative_generate
from tests.engine.helpers import (
    GreedyOracle,
    hf_greedy,
    llama_target,
    prompts,
    qwen3_target,
    random_draft,
)

MAX_NEW = 12
BLOCK = 10  # draft block_size: N in 0..9


# One HF greedy run per prompt and family; shorter expectations are its prefixes. Qwen3 runs
# are long enough for the oracle's lookahead (23 tokens + a block), the others for 20 tokens.
REF_LEN = {"qwen3": 23 + BLOCK, "llama": 20, "qwen3-sliding": 20}


@functools.cache
def _reference(family: str, idx: int) -> torch.Tensor:
    return hf_greedy(target_of(family), prompts()[idx], REF_LEN[family])


def reference(family: str, idx: int, max_new: int = MAX_NEW) -> torch.Tensor:
    """HF greedy prompt + `max_new` tokens (greedy runs are prefix-consistent)."""
    assert max_new <= REF_LEN[family]
    return _reference(family, idx)[: len(prompts()[idx]) + max_new]


def oracle(family: str = "qwen3", idxs=()) -> GreedyOracle:
    return GreedyOracle(target_of(family), BLOCK, known=[_reference(family, j) for j in idxs])


def target_of(family: str):
    makers = {"qwen3": qwen3_target, "llama": llama_target,
              "qwen3-sliding": functools.partial(qwen3_target, sliding=True)}
    return makers[family]()


def run_batches(target, draft, idxs, batch, n_spec, max_new=MAX_NEW, **kw):
    seqs, outs = [], []
    for i in range(0, len(idxs), batch):
        rows = [prompts()[j] for j in idxs[i:i + batch]]
        out = speculative_generate(target, draft, rows, max_new_tokens=max_new, num_speculative_tokens=n_spec, **kw)
        seqs += out.sequences
        outs.append(out)
    return seqs, outs


def assert_equal_rows(seqs, family, idxs, max_new=MAX_NEW):
    for s, j in zip(seqs, idxs, strict=True):
        ref = reference(family, j, max_new)
        assert s.tolist() == ref.tolist(), f"prompt {j}: got {s.tolist()} want {ref.tolist()}"
        assert len(s) - len(prompts()[j]) <= max_new


ALL = list(range(len(prompts())))


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("n_spec", [0, 1, 3, 7, BLOCK - 1])
def test_random_draft_greedy_equals_hf_qwen3(n_spec, batch):
    """>= 20 prompts of different lengths; batch 4 mixes lengths in one static-shape batch."""
    # batch 1 with a draft is the costliest cell (the torch top-k reference sorts the whole
    # vocabulary per draft slot), so it covers every 4th prompt; batch 4 and AR cover all 22.
    idxs = ALL if batch == 4 or n_spec == 0 else ALL[::4]
    seqs, outs = run_batches(qwen3_target(), random_draft(block_size=BLOCK), idxs, batch, n_spec)
    assert_equal_rows(seqs, "qwen3", idxs)
    for out in outs:
        assert out.num_speculative_tokens == n_spec
        assert all(0 <= a <= n_spec for row in out.accepted for a in row)


@pytest.mark.parametrize("n_spec", [0, BLOCK - 1])
def test_random_draft_greedy_equals_hf_llama(n_spec):
    idxs = ALL[:8]
    seqs, _ = run_batches(llama_target(), random_draft(block_size=BLOCK), idxs, 4, n_spec)
    assert_equal_rows(seqs, "llama", idxs)


@pytest.mark.parametrize("n_spec", [0, 4])
def test_sliding_window_target_equals_hf(n_spec):
    """Qwen3 with 6-token sliding windows on 3 of 4 layers; sequences run well past the window."""
    idxs = ALL[:8]
    seqs, _ = run_batches(target_of("qwen3-sliding"), oracle("qwen3-sliding", idxs), idxs, 4,
                          n_spec, max_new=20)
    assert_equal_rows(seqs, "qwen3-sliding", idxs, max_new=20)


def test_v1_draft_greedy_equals_hf():
    """A v1 checkpoint (no selector): per-slot argmax proposals through the same loop."""
    idxs = ALL[:8]
    seqs, _ = run_batches(qwen3_target(), random_draft(v2=False, block_size=BLOCK), idxs, 4, 5)
    assert_equal_rows(seqs, "qwen3", idxs)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("n_spec", [1, 3, 7, BLOCK - 1])
def test_oracle_draft_accepts_every_slot(n_spec, batch):
    """A proposer that drafts the target's own greedy tokens (tests.engine.helpers.GreedyOracle,
    passed as `draft=`) must see every slot accepted: tau = N + 1 on every step, and the
    output still equals HF greedy. This pins the accept/commit/rollback bookkeeping."""
    max_new = 23  # not a multiple of N + 1 for most N: the last run is cut by the length cap
    idxs = ALL[:8] if batch == 4 else ALL[:3]
    seqs, outs = run_batches(qwen3_target(), oracle("qwen3", idxs), idxs, batch, n_spec, max_new=max_new)
    assert_equal_rows(seqs, "qwen3", idxs, max_new=max_new)
    for out in outs:
        steps = -(-(max_new - 1) // (n_spec + 1))  # the prefill emits token 1
        for row in out.accepted:
            assert row == [n_spec] * steps
        assert out.stats()["tau_pooled"] == n_spec + 1
        assert all(len(g) == max_new for g in out.generated)
        assert out.finish_reasons == ["length"] * len(out.sequences)


def test_stop_tokens_truncate_inside_accepted_runs():
    """Each row stops right after the first stop token, even mid-run; rows stop independently."""
    idxs = ALL[:8]
    refs = [reference("qwen3", j).tolist()[len(prompts()[j]):] for j in idxs]
    stop_ids = sorted({refs[0][6], refs[1][3], refs[2][0], refs[3][10]})
    prop = oracle("qwen3", idxs)
    for batch in (4, 1):
        seqs, outs = run_batches(qwen3_target(), prop, idxs, batch, 7, stop_token_ids=stop_ids)
        reasons = [r for o in outs for r in o.finish_reasons]
        for s, j, ref, why in zip(seqs, idxs, refs, reasons):
            cut = next((i + 1 for i, t in enumerate(ref) if t in stop_ids), len(ref))
            assert s[len(prompts()[j]):].tolist() == ref[:cut]
            assert why == ("stop" if cut < len(ref) or ref[-1] in stop_ids else "length")
    # A single int works too, and a stop token as the very first generated token ends the row.
    out = speculative_generate(qwen3_target(), prop, [prompts()[2]], max_new_tokens=MAX_NEW, stop_token_ids=refs[2][0])
    assert out.generated[0].tolist() == [refs[2][0]] and out.accepted == [[]]


def test_progress_hook_counts_every_generated_token_and_changes_nothing():
    """The hook (a progress bar's) sees the prefill's first tokens, then each step's commits: they
    add up to the tokens generated, under long accepted runs, stop tokens and the length cap."""
    idxs = ALL[:4]
    refs = [reference("qwen3", j).tolist()[len(prompts()[j]):] for j in idxs]
    stops = [refs[1][5]]
    rows = [prompts()[j] for j in idxs]
    for draft, n_spec in [(None, 0), (oracle("qwen3", idxs), 7), (random_draft(block_size=BLOCK), 3)]:
        seen: list[int] = []
        out = speculative_generate(qwen3_target(), draft, rows, max_new_tokens=MAX_NEW, num_speculative_tokens=n_spec,
                                   stop_token_ids=stops, progress=seen.append)
        plain = speculative_generate(qwen3_target(), draft, rows, max_new_tokens=MAX_NEW,
                                     num_speculative_tokens=n_spec, stop_token_ids=stops)
        assert [s.tolist() for s in out.sequences] == [s.tolist() for s in plain.sequences]
        assert seen[0] == len(rows) and all(k >= 0 for k in seen)
        assert sum(seen) == sum(len(g) for g in out.generated) and len(seen) == 1 + len(max(out.accepted, key=len))
    with pytest.raises(ValueError, match="progress: 3 is not callable"):
        speculative_generate(qwen3_target(), None, rows, max_new_tokens=2, progress=3)


def test_max_new_tokens_edge_cases():
    target, draft = qwen3_target(), random_draft(block_size=BLOCK)
    p = prompts()[0]
    assert speculative_generate(target, draft, [p], max_new_tokens=0).sequences[0].tolist() == p.tolist()
    one = speculative_generate(target, draft, [p], max_new_tokens=1)
    assert one.generated[0].tolist() == reference("qwen3", 0)[len(p):len(p) + 1].tolist()
    assert one.accepted == [[]]


def test_input_forms_and_defaults():
    target, draft = qwen3_target(), random_draft(block_size=BLOCK)
    p = prompts()[4][:6]
    as_2d = speculative_generate(target, draft, torch.stack([p, p]), max_new_tokens=5)
    as_lists = speculative_generate(target, draft, [p.tolist(), p.tolist()], max_new_tokens=5)
    assert as_2d.num_speculative_tokens == BLOCK - 1  # default N = block_size - 1
    assert [s.tolist() for s in as_2d.sequences] == [s.tolist() for s in as_lists.sequences]
    ar = speculative_generate(target, None, [p], max_new_tokens=5)
    assert ar.num_speculative_tokens == 0 and ar.sequences[0].tolist() == as_2d.sequences[0].tolist()
    # a plain HF model and an already wrapped TargetModel behave the same
    from dflash2.target import TargetModel

    wrapped = speculative_generate(TargetModel(target), draft, [p], max_new_tokens=5)
    assert wrapped.sequences[0].tolist() == ar.sequences[0].tolist()
    assert target.config._attn_implementation == "sdpa"  # the engine restored the model's attention


def test_num_speculative_tokens_out_of_range():
    target, draft = qwen3_target(), random_draft(block_size=BLOCK)
    with pytest.raises(ValueError, match="block_size"):
        speculative_generate(target, draft, [prompts()[0]], max_new_tokens=4, num_speculative_tokens=BLOCK)
    with pytest.raises(ValueError, match="block_size"):
        speculative_generate(target, draft, [prompts()[0]], max_new_tokens=4, num_speculative_tokens=-1)
