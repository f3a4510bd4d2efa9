"""Property-based engine tests (hypothesis): random batch sizes, prompt lengths, N, stop
tokens and `max_new_tokens` on a tiny fp64 Qwen3 target.

For every drawn case, against the AR run of the same prompts without stop tokens:
- greedy speculative output == AR output, row by row, for a real DFlash2 draft, a v1 draft
  and an oracle that drafts the target's own tokens with random corruptions (so acceptance
  runs over every length from 0 to N);
- stop truncation is exact: each row ends right after its first stop token, else after
  `max_new_tokens`; finish reasons say which;
- accepted counts are consistent with the lengths: each in 0..N, one per decode step, and
  the steps' commits cover the generated tokens with only the last one cut short.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash2.engine import speculative_generate
from tests.engine.helpers import _Oracle, qwen3_target, random_draft

V = 48      # small vocabulary: random prompts and stop tokens hit often
BLOCK = 6   # draft block_size, so N in 0..5

# Bounded for the CPU tier: derandomized (the same cases every run), no deadline on a shared
# machine, nothing written to an example database.
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class CorruptedGreedyOracle(_Oracle):
    """Drafts the target's greedy token, replaced by another id with probability `corrupt`
    (private seeded generator); q is one-hot, so the greedy verifier accepts exactly the
    uncorrupted prefix of each block."""

    def __init__(self, model, block_size: int, corrupt: float, seed: int):
        super().__init__(model, block_size, target_layer_ids=(0,))
        self.corrupt = corrupt
        self.gen = torch.Generator().manual_seed(seed)

    def choose(self, logits, step, j):
        tok = logits.argmax(-1)
        flip = torch.rand(tok.shape, generator=self.gen) < self.corrupt
        tok = torch.where(flip, (tok + 1 + torch.randint(0, V - 1, tok.shape, generator=self.gen)) % V, tok)
        return tok, tok[:, None], torch.ones(tok.shape[0], 1, dtype=torch.float64)


@functools.lru_cache(maxsize=1)
def target():
    return qwen3_target(vocab=V, seed=11)


def make_draft(kind: str, corrupt: float, seed: int):
    if kind == "dflash2":
        return random_draft(vocab=V, block_size=BLOCK)
    if kind == "v1":
        return random_draft(vocab=V, v2=False, block_size=BLOCK)
    return CorruptedGreedyOracle(target(), BLOCK, corrupt, seed)


cases = st.fixed_dictionaries({
    "prompts": st.lists(st.lists(st.integers(0, V - 1), min_size=1, max_size=10), min_size=1, max_size=4),
    "n_spec": st.integers(0, BLOCK - 1),
    "max_new": st.integers(0, 14),
    "draft": st.sampled_from(["dflash2", "v1", "oracle"]),
    "corrupt": st.sampled_from([0.0, 0.3, 1.0]),
    "seed": st.integers(0, 2**16),
})


def expected_rows(free: list[list[int]], stops: list[int]) -> tuple[list[list[int]], list[str]]:
    """Cut each stop-free AR continuation right after its first stop token."""
    rows, reasons = [], []
    for g in free:
        cut = next((i + 1 for i, t in enumerate(g) if t in stops), None)
        rows.append(g[:cut] if cut else g)
        reasons.append("stop" if cut else "length")
    return rows, reasons


@PROPERTY
@given(case=cases, data=st.data())
def test_speculative_equals_ar_with_exact_stops_and_consistent_lengths(case, data):
    prompts, n_spec, max_new = case["prompts"], case["n_spec"], case["max_new"]
    tgt = target()
    free = speculative_generate(tgt, None, prompts, max_new_tokens=max_new)
    free_rows = [g.tolist() for g in free.generated]
    assert all(len(g) == max_new for g in free_rows) and set(free.finish_reasons) == {"length"}

    # Stop ids: some taken from the continuations (so rows do stop, at varied places), some random.
    produced = sorted({t for g in free_rows for t in g})
    hits = data.draw(st.lists(st.sampled_from(produced), max_size=2) if produced else st.just([]), label="hits")
    extra = data.draw(st.lists(st.integers(0, V - 1), max_size=2), label="extra")
    stops = sorted(set(hits + extra)) or None
    want, reasons = expected_rows(free_rows, stops or [])

    draft = make_draft(case["draft"], case["corrupt"], case["seed"])
    spec = speculative_generate(tgt, draft, prompts, max_new_tokens=max_new, num_speculative_tokens=n_spec,
                                stop_token_ids=stops)
    ar = speculative_generate(tgt, None, prompts, max_new_tokens=max_new, stop_token_ids=stops)
    for out in (spec, ar):
        assert [g.tolist() for g in out.generated] == want
        assert out.finish_reasons == reasons
        assert out.prompt_lengths == [len(p) for p in prompts]
        assert [s[: len(p)].tolist() for s, p in zip(out.sequences, prompts)] == prompts
    assert spec.num_speculative_tokens == n_spec and ar.num_speculative_tokens == 0

    for row, acc in zip(want, spec.accepted):
        assert all(0 <= a <= n_spec for a in acc)
        if not row:                      # max_new_tokens = 0: nothing ran
            assert acc == []
            continue
        if not acc:                      # the prefill's token already ended the row
            assert len(row) == 1
            continue
        # The prefill emits token 1; each step commits a + 1 tokens, cut only at the last step.
        assert 1 + sum(a + 1 for a in acc[:-1]) < len(row) <= 1 + sum(a + 1 for a in acc)
    assert all(acc == [0] * (len(row) - 1) for row, acc in zip(want, ar.accepted))
    if case["draft"] == "oracle" and case["corrupt"] == 0.0:
        assert all(a == n_spec for acc in spec.accepted for a in acc)  # a perfect draft is always accepted
