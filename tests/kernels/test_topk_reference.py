"""The fast top-k reference (torch.topk threshold + tie fill) equals the stable-sort definition."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.topk.reference import vocab_topk_by_sort, vocab_topk_reference


@pytest.mark.parametrize("case", ["random", "ties", "signed_zero", "neg_inf", "nan_row", "bf16_softcap"])
@pytest.mark.parametrize("k", [1, 5, 16])
def test_threshold_reference_equals_stable_sort(case, k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(7, 333, generator=g)
    mult, cap = 1.0, 0.0
    if case == "ties":
        x = torch.randint(-3, 3, (7, 333), generator=g).float()  # huge tie groups straddle the k-th place
    elif case == "signed_zero":
        x = torch.where(torch.rand(7, 333, generator=g) < 0.5, torch.tensor(-0.0), torch.tensor(0.0))
    elif case == "neg_inf":
        x[:, 5:] = float("-inf")
    elif case == "nan_row":
        x[2, 17] = float("nan")
    elif case == "bf16_softcap":
        x, mult, cap = (x * 30).bfloat16(), 0.25, 2.0  # softcap saturates -> many fp32 ties
    got = vocab_topk_reference(x, k, mult, cap)
    if case == "nan_row":  # documented: NaN ranks as +inf (and is returned as NaN)
        x = torch.where(torch.isnan(x), float("inf"), x)
    want = vocab_topk_by_sort(x, k, mult, cap)
    assert torch.equal(got[1], want[1])
    if case == "nan_row":
        want = (torch.where(torch.isinf(want[0]) & (want[0] > 0), float("nan"), want[0]), want[1])
        assert torch.equal(got[0].isnan(), want[0].isnan())
        got, want = got[0].nan_to_num(0.0), want[0].nan_to_num(0.0)
        assert torch.equal(got, want)
    else:
        assert torch.equal(got[0], want[0])
