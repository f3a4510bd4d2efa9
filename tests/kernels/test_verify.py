"""Verify: reference vs an explicit Python implementation; Triton vs reference; guards; law."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2.kernels.keyed_random import ACCEPT_STREAM, TARGET_STREAM, keyed_uniform
from dflash2.kernels.verify import _verify_block_triton, verify_block, verify_block_reference

TEMPS = [0.0, 1.0, 0.7, 0.0, 1.3, 1.0, 0.5]


def _problem(bsz, n, k, vocab, device="cpu", accept_rate=0.7, filtered=True):
    logits = torch.randn(bsz, n + 1, vocab) * 2.5
    if filtered:  # top-k filtering of some sampled rows: -inf entries
        logits[1::2, :, vocab // 2 :] = float("-inf")
        logits[1::2, :, 0] = 3.0  # keep the filtered rows' best token inside the kept half
    cand = torch.stack([torch.randperm(vocab // 2)[:k] for _ in range(bsz * max(n, 1))]).view(bsz, max(n, 1), k)[:, :n]
    # Draft the target argmax often, so accepted prefixes have all lengths.
    draft = torch.where(torch.rand(bsz, n) < accept_rate, logits[:, :n].argmax(-1), cand[..., 0])
    cand = cand.clone()
    hit = (cand == draft[..., None]).any(-1)
    cand[..., 0] = torch.where(hit, cand[..., 0], draft)  # the draft token is always a candidate
    q = torch.softmax(torch.randn(bsz, n, k), -1)
    temp = torch.tensor(TEMPS)[torch.arange(bsz) % len(TEMPS)]
    seeds = torch.randint(-(2**62), 2**62, (bsz,))
    pos = torch.randint(0, 2**20, (bsz,))
    return tuple(t.to(device) for t in (logits, draft, cand, q, temp, seeds, pos))


def _explicit_verify(logits, draft, cand, q, temp, seeds, pos):
    """Spec section 8 written out per request with Python floats."""
    bsz, n_rows, vocab = logits.shape
    n = n_rows - 1
    accepted_all, next_all = [], []
    for b in range(bsz):
        rows = logits[b].double().tolist()
        lse = [math.log(sum(math.exp(x) for x in r if x != -math.inf)) for r in rows]
        argmax = [max(range(vocab), key=lambda v: (r[v], -v)) for r in rows]
        acc = 0
        while acc < n:
            d = int(draft[b, acc])
            if temp[b] > 0:
                p_d = math.exp(rows[acc][d] - lse[acc])
                q_d = sum(float(q[b, acc, j]) for j in range(cand.shape[-1]) if int(cand[b, acc, j]) == d)
                u = keyed_uniform(int(seeds[b]), ACCEPT_STREAM, int(pos[b]) + acc, 0).item()
                ok = u * q_d < p_d
            else:
                ok = d == argmax[acc]
            if not ok:
                break
            acc += 1
        if temp[b] <= 0:
            nxt = argmax[acc]
        else:
            row = rows[acc]
            u = keyed_uniform(int(seeds[b]), TARGET_STREAM, int(pos[b]) + acc, torch.arange(vocab)).tolist()
            log_e = [math.log(-math.log(x)) for x in u]
            p_key = [(row[v] - log_e[v]) - lse[acc] if row[v] != -math.inf else -math.inf for v in range(vocab)]
            res_key = list(p_key)
            if acc < n:
                for j in range(cand.shape[-1]):
                    c = int(cand[b, acc, j])
                    r = math.exp(row[c] - lse[acc]) - float(q[b, acc, j])
                    res_key[c] = math.log(r) - log_e[c] if r > 0 else -math.inf
            key = res_key if max(res_key) > -math.inf else p_key  # empty residual: back to p
            nxt = max(range(vocab), key=lambda v: (key[v], -v))
        accepted_all.append(acc)
        next_all.append(nxt)
    return accepted_all, next_all


@pytest.mark.parametrize("n", [1, 3, 6])
def test_reference_matches_explicit(n) -> None:
    for _ in range(3):
        args = _problem(7, n, 4, 60)
        acc, nxt = verify_block_reference(*args)
        e_acc, e_nxt = _explicit_verify(*args)
        assert acc.tolist() == e_acc and nxt.tolist() == e_nxt


def test_reference_greedy_ties_lowest_id() -> None:
    logits = torch.zeros(1, 3, 10)
    logits[0, :, 4] = 1.0
    logits[0, :, 7] = 1.0
    draft = torch.tensor([[4, 7]])
    cand = torch.tensor([[[4, 7], [7, 4]]])
    q = torch.full((1, 2, 2), 0.5)
    zero = torch.zeros(1, dtype=torch.long)
    acc, nxt = verify_block_reference(logits, draft, cand, q, torch.zeros(1), zero, zero)
    assert acc.tolist() == [1] and nxt.tolist() == [4]


def test_empty_residual_falls_back_to_p(triton_device) -> None:
    # p lives on the 3 candidates only and q = 2p there (unnormalized on purpose): whenever the
    # draft is rejected, (p - q)+ is empty and the next token must be drawn from p itself.
    bsz, vocab = 64, 12
    logits = torch.full((bsz, 2, vocab), float("-inf"))
    logits[:, :, 2], logits[:, :, 5], logits[:, :, 9] = 0.0, 0.5, 1.0
    cand = torch.tensor([2, 5, 9]).expand(bsz, 1, 3).contiguous()
    p = torch.softmax(logits[0, 0], -1)[[2, 5, 9]]
    q = (2 * p).expand(bsz, 1, 3).contiguous()
    args = (logits, cand[..., 0].contiguous(), cand, q, torch.ones(bsz), torch.arange(bsz) * 31,
            torch.zeros(bsz, dtype=torch.long))
    args = tuple(t.to(triton_device) for t in args)
    acc, nxt = verify_block(*args, impl="torch")
    assert (acc == 0).any() and (acc == 1).any()
    assert set(nxt[acc == 0].tolist()) <= {2, 5, 9}
    e_acc, e_nxt = _explicit_verify(*(t.cpu() for t in args))
    assert acc.tolist() == e_acc and nxt.tolist() == e_nxt
    out = verify_block(*args, impl="triton")
    assert torch.equal(out[0], acc) and torch.equal(out[1], nxt)


# (B, N, k, V): single draft, odd vocab, several vocab chunks, real k and N.
CASES = [(7, 1, 4, 37), (7, 3, 5, 300), (5, 6, 16, 5000), (3, 15, 16, 2000)]
CASE_IDS = ["B{}-N{}-k{}-V{}".format(*c) for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_triton_matches_reference(case, triton_device) -> None:
    for trial in range(2):
        args = _problem(*case, device=triton_device, filtered=trial == 1)
        ref = verify_block(*args, impl="torch")
        out = verify_block(*args, impl="triton")
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("block", [64, 256], ids=lambda b: f"block{b}")
def test_triton_many_chunks(block, triton_device) -> None:
    args = _problem(7, 4, 6, 1000, device=triton_device)
    ref = verify_block(*args, impl="torch")
    out = _verify_block_triton(*args, block=block)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_triton_greedy_ties(triton_device) -> None:
    logits = torch.randint(0, 3, (4, 5, 700)).float()  # many tied maxima, spread over chunks
    draft = logits[:, :4].argmax(-1)
    cand = draft[..., None].repeat(1, 1, 2)
    args = (logits, draft, cand, torch.full((4, 4, 2), 0.5), torch.zeros(4), torch.zeros(4, dtype=torch.long),
            torch.zeros(4, dtype=torch.long))
    args = tuple(t.to(triton_device) for t in args)
    out = _verify_block_triton(*args, block=128)
    assert out[0].tolist() == [4, 4, 4, 4]
    assert torch.equal(out[1], logits[:, 4].argmax(-1).to(triton_device))


@pytest.mark.parametrize("poison", ["nan", "all_neg_inf", "pos_inf"])
def test_bad_rows_raise_or_flag(poison, triton_device) -> None:
    args = list(_problem(4, 3, 4, 200, device=triton_device))
    bad_value = {"nan": float("nan"), "all_neg_inf": float("-inf"), "pos_inf": float("inf")}[poison]
    if poison == "all_neg_inf":
        args[0][2, 1, :] = bad_value
    else:
        args[0][2, 1, 17] = bad_value
    with pytest.raises(ValueError, match=r"rows \[2\]"):
        verify_block(*args, impl="torch")
    acc, nxt = verify_block(*args, impl="triton")
    assert acc[2].item() == 0 and nxt[2].item() == -1
    good = [0, 1, 3]
    ref = verify_block(*(a[good] for a in args), impl="torch")
    assert torch.equal(acc[good], ref[0]) and torch.equal(nxt[good], ref[1])


def test_sampled_output_follows_p() -> None:
    # Losslessness: draft d ~ q, then verify; the first committed token (d if accepted, else the
    # residual draw) must follow p_0, and the bonus after an acceptance must follow p_1.
    # Chi-square with V - 1 = 7 dof at false-alarm rate 1e-3 (critical value 24.32); fixed seeds.
    n_req, vocab, k = 40000, 8, 4
    gen = torch.Generator().manual_seed(1234)
    logits = torch.randn(1, 2, vocab, generator=gen).expand(n_req, 2, vocab).contiguous()
    logits[:, :, 6] = float("-inf")  # a filtered token: p = 0 there, and it must never appear
    cand = torch.tensor([0, 3, 5, 6]).expand(n_req, 1, k).contiguous()
    q_row = torch.tensor([0.1, 0.5, 0.3, 0.1])  # q puts mass on the filtered token too
    draft = cand[:, 0].gather(1, torch.multinomial(q_row, n_req, replacement=True, generator=gen)[:, None])
    q = q_row.expand(n_req, 1, k).contiguous()
    seeds = torch.arange(n_req) * 1_000_003 + 17
    acc, nxt = verify_block_reference(logits, draft, cand, q, torch.ones(n_req), seeds, torch.full((n_req,), 100))
    first = torch.where(acc == 1, draft[:, 0], nxt)
    p = torch.softmax(logits[0], -1).double()
    crit = 24.32
    for tokens, law in ((first, p[0]), (nxt[acc == 1], p[1])):
        counts = torch.bincount(tokens, minlength=vocab).double()
        assert counts[6] == 0
        keep = law > 0
        expected = law[keep] * tokens.numel()
        chi2 = ((counts[keep] - expected) ** 2 / expected).sum().item()
        assert chi2 < crit, chi2


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_gpu_real_shapes(batch, cuda_device) -> None:
    for trial in range(2):
        args = _problem(batch, 15, 16, 151936, device=cuda_device, filtered=trial == 1)
        ref = verify_block(*args, impl="torch")
        out = verify_block(*args, impl="triton")
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
