"""Sampled (T > 0) losslessness and the sampling controls.

Distribution tests: a tiny Qwen3 target with V = 16 (LM head scaled x10: next-token entropy
~2 nats, so the law is far from uniform), one fixed prompt replicated over R rows of one
batch. Each row gets its own seed (`row_seed(seed, b)`), so the rows are R independent
samples. The exact law of the first 4 generated tokens is computed by enumerating all
16^3 prefixes with stock forwards and transformers' own temperature/top-k/top-p warpers.

Statistic: Pearson chi-square per generated position (marginal over 16 tokens) and for the
joint of positions 3 and 4 (256 cells), cells with expected count < 5 pooled into one.
Each test rejects at ALPHA = 1e-4; the seeds are fixed, so the outcome is deterministic, and
for a correct engine the chance that a given seed choice fails one of the 5 checks of a
configuration is <= 5e-4 (<= 2.5e-3 over the 5 passing configurations, Bonferroni). The
negative control shows the same checks do reject a proposer that misreports q.
"""

from __future__ import annotations

import functools

import pytest
import torch
from scipy import stats as sps
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from dflash2.engine import filter_logits, row_seed, row_seeds, speculative_generate
from dflash2.engine.draft import DFlash2Proposer, DraftStep, Proposal
from tests.engine.helpers import SamplingOracle, prompts, qwen3_target, random_draft

V = 16
R = 2000  # samples per configuration
STEPS = 4  # generated positions checked
ALPHA = 1e-4
PROMPT = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])


def small_target():
    return qwen3_target(vocab=V, head_scale=10.0)


def warper(temperature: float, top_k: int = 0, top_p: float = 1.0):
    procs = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return lambda logits: torch.softmax(procs(None, logits), dim=-1)


@functools.cache
def exact_law(temperature: float, top_k: int = 0, top_p: float = 1.0):
    """Exact marginals of positions 1..4 and the joint of positions 3 and 4."""
    model = small_target()
    w = warper(temperature, top_k, top_p)
    marg, weights = [], torch.ones(1, dtype=torch.float64)
    prefixes = torch.empty(1, 0, dtype=torch.long)
    with torch.no_grad():
        for t in range(STEPS):
            seqs = torch.cat([PROMPT[None].expand(prefixes.shape[0], -1), prefixes], 1)
            full = weights[:, None] * w(model(input_ids=seqs).logits[:, -1].double())  # [V^t, V]
            marg.append(full.sum(0))
            if t == STEPS - 1:
                joint = full.view(-1, V, V).sum(0)  # [V, V]: (token t, token t+1)
            nxt = torch.arange(V).repeat(prefixes.shape[0])[:, None]
            prefixes = torch.cat([prefixes.repeat_interleave(V, 0), nxt], 1)
            weights = full.reshape(-1)
    return marg, joint


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    counts, expected = counts.double().flatten(), probs.double().flatten() * counts.sum()
    assert torch.all(counts[expected == 0] == 0), "a token with zero target probability was emitted"
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(sps.chi2.sf(stat, int(keep.sum()) - 1))


def pvalues(out, temperature, top_k=0, top_p=1.0) -> list[float]:
    gen = torch.stack([g[:STEPS] for g in out.generated])  # [R, STEPS]
    marg, joint = exact_law(temperature, top_k, top_p)
    ps = [chi_square_pvalue(torch.bincount(gen[:, t], minlength=V), marg[t]) for t in range(STEPS)]
    pair = torch.bincount(gen[:, STEPS - 2] * V + gen[:, STEPS - 1], minlength=V * V)
    return ps + [chi_square_pvalue(pair, joint)]


class Wrapped:
    """A `DFlash2Proposer` driven from outside, so a test can inspect or alter proposals."""

    def __init__(self, draft, target, transform=None):
        self.draft, self.target, self.transform = draft, target, transform
        self.block_size, self.target_layer_ids = draft.block_size, draft.config.target_layer_ids
        self.inner, self.seen = None, []

    def propose(self, step: DraftStep) -> Proposal:
        if self.inner is None:
            from dflash2.target import as_target

            self.inner = DFlash2Proposer(self.draft, as_target(self.target), step.anchor.shape[0],
                                         step.tokens.shape[1] - 1, "torch")
        prop = self.inner.propose(step)
        self.seen.append(prop)
        return self.transform(prop) if self.transform else prop


CONFIGS = {
    "v2-T1": dict(draft="v2", n=3, temperature=1.0),
    "v2-T0.7-topk8-topp0.9": dict(draft="v2", n=5, temperature=0.7, top_k=8, top_p=0.9),
    "v1-onehot-T1": dict(draft="v1", n=3, temperature=1.0),
    "oracle-T0.8-topk5": dict(draft="oracle", n=3, temperature=0.8, top_k=5),
    "ar-T1": dict(draft=None, n=0, temperature=1.0),
}


def make_draft(kind, temperature):
    if kind == "v2":
        return random_draft(vocab=V, top_k=4, std=0.3)
    if kind == "v1":
        return random_draft(vocab=V, v2=False, std=0.3)
    if kind == "oracle":
        return SamplingOracle(small_target(), 10, temperature, k=4, seed=1)
    return None


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampled_distribution_matches_target(name):
    cfg = CONFIGS[name]
    filt = dict(top_k=cfg.get("top_k", 0), top_p=cfg.get("top_p", 1.0))
    draft = make_draft(cfg["draft"], cfg["temperature"])
    out = speculative_generate(small_target(), draft, PROMPT[None].expand(R, -1), max_new_tokens=STEPS,
                               num_speculative_tokens=cfg["n"], temperature=cfg["temperature"], seed=1234, **filt)
    assert all(len(g) == STEPS for g in out.generated)
    ps = pvalues(out, cfg["temperature"], **filt)
    assert min(ps) > ALPHA, f"{name}: chi-square p-values {ps}"
    if cfg["draft"] == "oracle":  # q close to p: most slots accepted, so long runs are exercised
        assert out.stats()["per_position_acceptance"][0] > 0.6


def test_misreported_q_is_detected():
    """Negative control (power of the check above): a sampled v2 walk that reports a uniform
    q over its k candidates instead of the law it really drew from must fail the same
    checks. (A one-hot q on the drawn token would *not* be a bug: accepting d with
    probability p(d) and otherwise drawing from p without d is exact for any d chosen
    independently of the verifier's noise -- that is how v1 proposals stay lossless.)"""

    def uniform_q(prop: Proposal) -> Proposal:
        return Proposal(prop.tokens, prop.cand_ids, torch.full_like(prop.q, 1.0 / prop.q.shape[-1]), prop.invalid)

    proposer = Wrapped(random_draft(vocab=V, top_k=4, std=0.3), small_target(), uniform_q)
    out = speculative_generate(small_target(), proposer, PROMPT[None].expand(R, -1), max_new_tokens=STEPS,
                               num_speculative_tokens=3, temperature=1.0, seed=1234)
    assert min(pvalues(out, 1.0)) < ALPHA


@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_q_rows_are_distributions_over_candidates(temperature):
    proposer = Wrapped(random_draft(top_k=4), qwen3_target())
    out = speculative_generate(qwen3_target(), proposer, prompts()[:3], max_new_tokens=6,
                               num_speculative_tokens=4, temperature=temperature, seed=7)
    assert len(proposer.seen) == len(out.accepted[0])
    for prop in proposer.seen:
        q, cand, tok = prop.q, prop.cand_ids, prop.tokens
        assert q.dtype == torch.float32 and q.shape == cand.shape == (3, 4, 4)
        assert torch.all(q >= 0) and torch.allclose(q.sum(-1), torch.ones(3, 4), atol=1e-5)
        assert torch.all((cand == tok[..., None]).any(-1))  # each proposal is one of its candidates
        assert torch.all(q.gather(-1, (cand == tok[..., None]).int().argmax(-1, keepdim=True)) > 0)
        if temperature == 0:
            assert torch.all((q == 0) | (q == 1))


def test_sampled_rows_do_not_depend_on_batch_neighbours():
    target, draft = qwen3_target(), random_draft(top_k=4)
    p = prompts()
    kw = dict(max_new_tokens=8, num_speculative_tokens=3, temperature=1.0, top_k=50, seed=99)
    a = speculative_generate(target, draft, [p[0], p[1], p[2]], **kw)
    b = speculative_generate(target, draft, [p[0], p[5]], **kw)
    again = speculative_generate(target, draft, [p[0], p[1], p[2]], **kw)
    assert a.sequences[0].tolist() == b.sequences[0].tolist()
    assert [s.tolist() for s in a.sequences] == [s.tolist() for s in again.sequences]
    other = speculative_generate(target, draft, [p[0]], **{**kw, "seed": 100})
    assert other.sequences[0].tolist() != a.sequences[0].tolist()
    ar1 = speculative_generate(target, None, [p[0], p[1]], **{**kw, "num_speculative_tokens": 0})
    ar2 = speculative_generate(target, None, [p[0], p[3]], **{**kw, "num_speculative_tokens": 0})
    assert ar1.sequences[0].tolist() == ar2.sequences[0].tolist()


def test_per_row_seeds_sample_as_batches_of_one():
    """A list of seeds gives row b exactly the draws of a batch of one with seed[b] (the
    evaluation runner keys seeds by sample id and batches sampled prompts)."""
    target, draft = qwen3_target(), random_draft(top_k=4)
    p = prompts()
    kw = dict(max_new_tokens=8, num_speculative_tokens=3, temperature=1.0, top_k=50)
    batched = speculative_generate(target, draft, [p[0], p[4], p[2]], seed=[11, 12, 13], **kw)
    alone = [speculative_generate(target, draft, [p[i]], seed=s, **kw).sequences[0].tolist()
             for i, s in ((0, 11), (4, 12), (2, 13))]
    assert [s.tolist() for s in batched.sequences] == alone
    swapped = speculative_generate(target, draft, [p[2], p[0]], seed=[13, 11], **kw)
    assert [s.tolist() for s in swapped.sequences] == [alone[2], alone[0]]
    with pytest.raises(ValueError, match="seed"):
        speculative_generate(target, draft, [p[0], p[1]], seed=[1], **kw)
    with pytest.raises(ValueError, match=r"seed\[1\]"):
        speculative_generate(target, draft, [p[0], p[1]], seed=[1, -2], **kw)


def test_row_seeds():
    s = row_seeds(5, 4)
    assert s.dtype == torch.int64 and len(set(s.tolist())) == 4 and torch.all(s >= 0)
    assert s.tolist() == [row_seed(5, b) for b in range(4)] and s.tolist() != row_seeds(6, 4).tolist()


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.8), (7, 0.6), (1, 0.5)])
def test_filter_logits_matches_transformers_warpers(top_k, top_p):
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randn(3, 4, 50, generator=g, dtype=torch.float64) * 3
    temps = torch.tensor([0.7, 0.0, 1.3])
    out = filter_logits(logits, temps, top_k, top_p)
    assert out.dtype == torch.float32
    assert torch.equal(out[1], logits[1].float())  # greedy row untouched
    for b in (0, 2):
        procs = LogitsProcessorList([TemperatureLogitsWarper(float(temps[b]))])
        if top_k:
            procs.append(TopKLogitsWarper(top_k))
        if top_p < 1.0:
            procs.append(TopPLogitsWarper(top_p))
        want = procs(None, logits[b].float())
        assert torch.equal(torch.isinf(out[b]), torch.isinf(want))
        torch.testing.assert_close(out[b][~torch.isinf(want)], want[~torch.isinf(want)])
