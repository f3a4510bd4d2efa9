"""Selector: transition scores and walk vs explicit loops; Triton walk vs reference; its law."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2.kernels.keyed_random import DRAFT_STREAM, keyed_uniform
from dflash2.kernels.selector import selector_walk, selector_walk_reference, transition_scores

# fp32 scores: the kernel sums the R products in another order than torch, so q is compared to
# an fp64 walk (STYLE.md item 6). The floor is what two ulps of the largest score, divided by the
# smallest temperature, do to a softmax: sum-order noise that neither implementation avoids.
Q_ATOL = 1e-5  # reference vs explicit loop at tiny shapes (scores ~3, T >= 0.3)
# q rows sum to 1 up to the fp32 rounding of k <= 16 terms and, on the GPU, the approximate exp
# and division (~2 ulp each); 2.3e-6 was measured on an H200, so allow 1e-5.
Q_SUM_ATOL = 1e-5


def _problem(bsz, n, k, rank, vocab, code_dtype=torch.bfloat16, eta_dtype=torch.float32, device="cpu"):
    unary = torch.randn(bsz, n, k)
    cand = torch.stack([torch.randperm(vocab)[:k] for _ in range(bsz * n)]).view(bsz, n, k)
    eta = torch.randn(bsz, n, rank).to(eta_dtype)
    a = torch.randn(vocab, rank).to(code_dtype)
    z = torch.randn(vocab, rank).to(code_dtype)
    anchor = torch.randint(0, vocab, (bsz,))
    temp = torch.tensor([0.0, 0.7, 1.0, 1.6, 0.0, 0.3])[torch.arange(bsz) % 6]
    seeds = torch.randint(-(2**62), 2**62, (bsz,))
    pos = torch.randint(0, 2**20, (bsz,))
    args = (unary, cand, eta, a, z, anchor, temp, seeds, pos)
    return tuple(t.to(device) for t in args)


def test_transition_scores_explicit() -> None:
    pred = torch.randint(0, 30, (2, 3))
    eta = torch.randn(2, 3, 5, dtype=torch.float64)
    cand = torch.randint(0, 30, (2, 3, 4))
    a = torch.randn(30, 5, dtype=torch.float64)
    z = torch.randn(30, 5, dtype=torch.float64)
    out = transition_scores(pred, eta, cand, a, z)
    assert out.shape == (2, 3, 4) and out.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            for c in range(4):
                expect = sum(float(a[pred[i, j], r] * eta[i, j, r] * z[cand[i, j, c], r]) for r in range(5))
                assert math.isclose(out[i, j, c].item(), expect, rel_tol=1e-5, abs_tol=1e-5)


def test_transition_scores_differentiable() -> None:
    pred = torch.randint(0, 10, (3,))
    cand = torch.randint(0, 10, (3, 4))
    eta = torch.randn(3, 6, requires_grad=True)
    a = torch.randn(10, 6, requires_grad=True)
    z = torch.randn(10, 6, requires_grad=True)
    transition_scores(pred, eta, cand, a, z).square().sum().backward()
    assert eta.grad is not None and a.grad is not None and z.grad is not None
    assert a.grad[pred].abs().sum() > 0 and z.grad[cand.flatten()].abs().sum() > 0


def _explicit_walk(unary, cand, eta, a, z, anchor, temp, seeds, pos):
    """Per request, per slot, per candidate, in fp64 Python arithmetic."""
    bsz, n, k = unary.shape
    rank = eta.shape[-1]
    tokens, chosen, qs = [], [], []
    for b in range(bsz):
        prev, t_b = int(anchor[b]), float(temp[b])
        toks, picks, qrow = [], [], []
        for j in range(n):
            row = []
            for c in range(k):
                tok = int(cand[b, j, c])
                edge = sum(float(a[prev, r]) * float(eta[b, j, r]) * float(z[tok, r]) for r in range(rank))
                row.append(float(unary[b, j, c]) + edge)
            if t_b > 0:
                scaled = [x / t_b for x in row]
                u = keyed_uniform(int(seeds[b]), DRAFT_STREAM, int(pos[b]) + j, cand[b, j]).tolist()
                score = [s - math.log(-math.log(ui)) for s, ui in zip(scaled, u)]
                mx = max(scaled)
                e = [math.exp(s - mx) for s in scaled]
                q = [x / sum(e) for x in e]
            else:
                score = row
            pick = max(range(k), key=lambda c: (score[c], -c))  # ties -> lowest index
            if t_b <= 0:
                q = [1.0 if c == pick else 0.0 for c in range(k)]
            prev = int(cand[b, j, pick])
            toks.append(prev)
            picks.append(pick)
            qrow.append(q)
        tokens.append(toks)
        chosen.append(picks)
        qs.append(qrow)
    return tokens, chosen, torch.tensor(qs)


@pytest.mark.parametrize("n", [1, 4])
def test_reference_walk_matches_explicit(n) -> None:
    args = _problem(6, n, 5, 7, 40)
    tokens, chosen, q = selector_walk_reference(*args)
    e_tokens, e_chosen, e_q = _explicit_walk(*args)
    assert tokens.tolist() == e_tokens and chosen.tolist() == e_chosen
    torch.testing.assert_close(q.double(), e_q.double(), rtol=0, atol=Q_ATOL)
    torch.testing.assert_close(q.sum(-1), torch.ones(6, n), rtol=0, atol=Q_SUM_ATOL)


# (B, N, k, R, V): length-1 block, non power-of-two k and R, real k = 16.
CASES = [(6, 1, 5, 20, 100), (5, 7, 16, 24, 300), (3, 15, 16, 64, 500), (2, 3, 3, 256, 64)]
CASE_IDS = ["B{}-N{}-k{}-R{}-V{}".format(*c) for c in CASES]


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)],
                         ids=["bf16code", "bf16eta"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_triton_walk_matches_reference(case, dtypes, triton_device, error_within) -> None:
    args = _problem(*case, code_dtype=dtypes[0], eta_dtype=dtypes[1], device=triton_device)
    ref = selector_walk(*args, impl="torch")
    out = selector_walk(*args, impl="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    exact, floor = _exact_q(args, ref[0])
    error_within(out[2].cpu(), ref[2].cpu(), exact, floor)
    torch.testing.assert_close(out[2].sum(-1), torch.ones_like(out[2][..., 0]), rtol=0, atol=Q_SUM_ATOL)
    # tokens are the chosen candidates
    assert torch.equal(out[0], args[1].gather(2, out[1][..., None]).squeeze(-1))


def _exact_q(args, tokens) -> tuple[torch.Tensor, float]:
    """fp64 softmax(row / T) (one-hot at T = 0) along a given path, from the formulas, and the
    comparison floor: two fp32 ulps of the largest score over the smallest temperature."""
    unary, cand, eta, a, z, anchor, temp, _, _ = (t.cpu() for t in args)
    tokens = tokens.cpu()
    bsz, n, k = unary.shape
    prev = torch.cat([anchor[:, None], tokens[:, :-1]], 1)  # [B, N] predecessor of each slot
    rows = unary.double() + torch.einsum(
        "bnr,bnkr->bnk", a.double()[prev] * eta.double(), z.double()[cand]
    )
    t = torch.where(temp > 0, temp.double(), torch.ones_like(temp, dtype=torch.float64))
    soft = torch.softmax(rows / t[:, None, None], -1)
    hot = (rows == rows.amax(-1, keepdim=True)).double()
    floor = 2 * 2.0**-23 * rows.abs().max().item() / t.min().item()
    return torch.where((temp > 0)[:, None, None], soft, hot), floor


def test_walk_ties_pick_lowest_index(triton_device) -> None:
    args = list(_problem(2, 3, 6, 8, 50, device=triton_device))
    args[0] = torch.zeros_like(args[0])  # equal unary scores
    args[4] = torch.zeros_like(args[4])  # successor codebook 0 (identity init): every row ties
    args[6] = torch.zeros_like(args[6])  # greedy
    for impl in ("torch", "triton"):
        tokens, chosen, q = selector_walk(*args, impl=impl)
        assert (chosen == 0).all()
        assert (q[..., 0] == 1).all()


def test_triton_walk_reads_a_strided_eta(triton_device) -> None:
    # The engine's eta can be a column slice of one fused launch's output (selector gate and LM
    # head): rows strided, unit stride along R. The walk reads it in place, with the same result.
    args = list(_problem(3, 4, 6, 16, 50, device=triton_device))
    wide = torch.randn(3, 4, 40, device=triton_device)
    wide[..., 8:24] = args[2]
    strided = wide[..., 8:24]
    assert not strided.is_contiguous() and strided.stride(-1) == 1
    want = selector_walk(*args, impl="triton")
    args[2] = strided
    got = selector_walk(*args, impl="triton")
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_sampled_walk_follows_q() -> None:
    # One slot, 20000 requests that differ only in seed: the picks must follow softmax(row / T).
    # Chi-square with k - 1 = 5 dof at false-alarm rate 1e-3 (critical value 20.52); fixed seeds.
    n_req, k = 20000, 6
    unary = torch.tensor([[1.0, 0.5, 0.0, -0.5, 2.0, 0.2]]).expand(n_req, 1, k)
    cand = torch.arange(k)[None, None].expand(n_req, 1, k)
    eta = torch.zeros(n_req, 1, 4)
    a = torch.zeros(k, 4)
    temp = torch.full((n_req,), 0.8)
    seeds = torch.arange(n_req) * 7919 + 3
    pos = torch.full((n_req,), 42)
    _, chosen, q = selector_walk_reference(unary, cand, eta, a, a, torch.zeros(n_req, dtype=torch.long), temp, seeds,
                                           pos)
    counts = torch.bincount(chosen[:, 0], minlength=k).double()
    expected = q[0, 0].double() * n_req
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 20.52, chi2


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_gpu_real_shapes(batch, cuda_device, error_within) -> None:
    # Qwen3-8B: V 151936, R 256, k 16, N 15.
    args = _problem(batch, 15, 16, 256, 151936, device=cuda_device)
    ref = selector_walk(*args, impl="torch")
    out = selector_walk(*args, impl="triton")
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    exact, floor = _exact_q(args, ref[0])
    error_within(out[2].cpu(), ref[2].cpu(), exact, floor)
