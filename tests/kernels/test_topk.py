"""Vocabulary top-k: reference vs an explicit sort; Triton vs reference (ids exact)."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.topk import _vocab_topk_triton, head_transform, vocab_topk, vocab_topk_reference

# fp32 head transform: multiplier * x is exact in both; the softcap's tanh is torch's (<= 1 ulp)
# vs our polynomial / exp form (<= ~3 ulp, measured 2.5), so values may differ by a few ulps.
SOFTCAP_ULPS = 8 * 2.0**-24


def _explicit_topk(values: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    vals, ids = [], []
    for row in values.double().tolist():
        order = sorted(range(len(row)), key=lambda v: (-row[v], v))[:k]  # ties -> lowest id
        vals.append([row[v] for v in order])
        ids.append(order)
    return vals, ids


def _tied_logits(m: int, v: int, dtype: torch.dtype) -> torch.Tensor:
    # Few distinct values: nearly every top-k entry is tied with others.
    x = torch.randint(-3, 4, (m, v)).to(dtype)
    x[:, 1::7] = -0.0  # signed zeros must tie with +0.0
    x[0, :5] = float("-inf")
    return x


@pytest.mark.parametrize("tied", [False, True], ids=["random", "tied"])
def test_reference_matches_explicit_sort(tied) -> None:
    logits = _tied_logits(4, 300, torch.float32) if tied else torch.randn(4, 300)
    values, ids = vocab_topk_reference(logits, 9)
    exp_vals, exp_ids = _explicit_topk(logits, 9)
    assert ids.tolist() == exp_ids
    assert values.double().tolist() == exp_vals


def test_reference_transform() -> None:
    logits = torch.randn(3, 50, dtype=torch.float64) * 40
    values, ids = vocab_topk_reference(logits, 5, multiplier=0.25, softcap=20.0)
    expect = 20.0 * torch.tanh(0.25 * logits / 20.0)
    torch.testing.assert_close(values.double(), expect.gather(1, ids), rtol=1e-6, atol=1e-6)
    assert values.dtype == torch.float32 and ids.dtype == torch.int64


# (M, V, k): tiny vocab, k > group size, V not a multiple of anything, length-1 rows.
CASES = [(1, 37, 5), (3, 1000, 16), (5, 4099, 7), (2, 5000, 1), (4, 300, 33), (1, 16, 16)]
CASE_IDS = ["M{}-V{}-k{}".format(*c) for c in CASES]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_triton_matches_reference(case, dtype, triton_device) -> None:
    m, v, k = case
    logits = (torch.randn(m, v) * 3).to(dtype).to(triton_device)
    ref_vals, ref_ids = vocab_topk(logits, k, impl="torch")
    vals, ids = vocab_topk(logits, k, impl="triton")
    assert torch.equal(ids, ref_ids)
    assert torch.equal(vals, ref_vals)  # multiplier 1, no softcap: the values are exact


@pytest.mark.parametrize("groups", [2, 16, 64], ids=lambda g: f"groups{g}")
def test_triton_ties_and_chunking(groups, triton_device) -> None:
    # Small chunks (groups * 16 entries) -> many partials to merge; heavy ties across chunks.
    logits = _tied_logits(3, 2100, torch.bfloat16).to(triton_device)
    ref_vals, ref_ids = vocab_topk(logits, 12, impl="torch")
    vals, ids = _vocab_topk_triton(logits, 12, 1.0, 0.0, config={"groups": groups, "num_warps": 2})
    assert torch.equal(ids, ref_ids)
    assert torch.equal(vals, ref_vals)


@pytest.mark.parametrize("mult,cap", [(0.19611613513818404, 20.0), (1.0, 3.0), (-0.5, 0.0)],
                         ids=["fixture", "cap3", "negmult"])
def test_triton_multiplier_softcap(mult, cap, triton_device, error_within) -> None:
    logits = (torch.randn(3, 3000) * 30).to(triton_device)
    ref_vals, ref_ids = vocab_topk(logits, 16, mult, cap, impl="torch")
    vals, ids = vocab_topk(logits, 16, mult, cap, impl="triton")
    exact = head_transform(logits.double(), mult, cap).gather(1, ids)
    ref_exact = head_transform(logits.double(), mult, cap).gather(1, ref_ids)
    error_within(vals, ref_vals, ref_exact, SOFTCAP_ULPS * max(cap, 1.0))
    torch.testing.assert_close(vals.double(), exact, rtol=0, atol=SOFTCAP_ULPS * max(cap, 1.0))
    # Ids agree wherever neighbouring values are further apart than the transform's error.
    gap = (ref_vals[:, :-1] - ref_vals[:, 1:]).abs()
    safe = torch.cat([gap, gap[:, -1:]], 1) > 4 * SOFTCAP_ULPS * max(cap, 1.0)
    assert torch.equal(ids[safe], ref_ids[safe])


def test_k_out_of_range() -> None:
    with pytest.raises(ValueError, match="k="):
        vocab_topk(torch.randn(2, 10), 11)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [16, 128, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_real_shapes(rows, dtype, cuda_device) -> None:
    logits = (torch.randn(rows, 151936, device=cuda_device) * 4).to(dtype)
    logits[0, 100:200] = logits[0].max()  # a block of exact ties at the top of row 0
    ref_vals, ref_ids = vocab_topk(logits, 16, impl="torch")
    vals, ids = vocab_topk(logits, 16, impl="triton")
    assert torch.equal(ids, ref_ids)
    assert torch.equal(vals, ref_vals)
    assert ids[0].tolist() == list(range(100, 116))


@pytest.mark.parametrize("k", [5, 40], ids=lambda k: f"k{k}")
def test_triton_all_tied_rows(k, triton_device) -> None:
    # Whole rows of one value (-inf, signed zeros, a constant): every group maximum ties, so the
    # group selection must break ties by the lowest group and the result is ids 0..k-1.
    logits = torch.zeros(4, 1500)
    logits[0] = float("-inf")
    logits[1, 1::2] = -0.0
    logits[2] = 2.5
    logits[3, 700:] = 1.0  # the top lies past several groups / chunks
    logits = logits.to(torch.bfloat16).to(triton_device)
    ref_vals, ref_ids = vocab_topk(logits, k, impl="torch")
    for groups in (16, 256):
        vals, ids = _vocab_topk_triton(logits, k, 1.0, 0.0, config={"groups": groups, "num_warps": 2})
        assert torch.equal(ids, ref_ids)
        assert torch.equal(vals, ref_vals)
    assert ids[:3].tolist() == [list(range(k))] * 3
