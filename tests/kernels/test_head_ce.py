"""`head_ce` (the fused head loss's logsumexp, logit gradient and group maxima in one launch)
against its torch reference.

Tolerance: the group maxima are exact (a maximum rounds nothing). The kernel's logsumexp sums
online, tile by tile, in another order than `torch.logsumexp`: within a few fp32 ulps of the
reference's value. The gradient `coef * (exp(z - lse) - onehot)` moves by that lse error times
its own size, plus the fp32 `exp`'s last bit, before its one rounding to the dtype: fp32 outputs
within a few ulps of the gradient's scale, 16-bit ones within one ulp of the dtype and equal on at
least 99 % of the elements.
"""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.head_ce import head_ce, head_ce_reference

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}


def _inputs(n: int, v: int, dtype: torch.dtype, device: str, scale: float = 4.0):
    g = torch.Generator().manual_seed(n * 7 + v)
    z = (torch.randn(n, v, generator=g) * scale).to(dtype)
    y = torch.randint(0, v, (n,), generator=g)
    coef = torch.rand(n, generator=g)
    return z.to(device), y.to(device), coef.to(device)


def test_reference_is_the_ce_gradient_and_the_group_max():
    z, y, coef = _inputs(6, 256, torch.float64, "cpu")
    lse, grad, gmax = head_ce(z, y, coef.double(), group=32, impl="torch")
    zr = z.clone().requires_grad_(True)
    (coef.double() * torch.nn.functional.cross_entropy(zr, y, reduction="none")).sum().backward()
    torch.testing.assert_close(grad, zr.grad, rtol=1e-5, atol=1e-6)       # fp32 math inside
    torch.testing.assert_close(lse.double(), torch.logsumexp(z, -1), rtol=1e-6, atol=1e-6)
    assert torch.equal(gmax, z.view(6, 8, 32).amax(-1))
    assert torch.equal(head_ce_reference(z, y, coef.double(), 32)[2], gmax)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n,v,group", [(1, 128, 128), (5, 128 * 19, 128), (3, 64 * 24, 64), (4, 16 * 8, 16)],
                         ids=["one_group", "partial_tile", "group64", "one_tile"])
def test_triton_matches_the_reference(triton_device, dtype, n, v, group):
    z, y, coef = _inputs(n, v, dtype, triton_device)
    with torch.no_grad():
        lse, grad, gmax = head_ce(z, y, coef, group=group, impl="triton")
    rl, rg, rm = head_ce_reference(z, y, coef, group)
    assert lse.dtype == torch.float32 and grad.dtype == dtype and gmax.dtype == dtype
    assert grad.shape == z.shape and gmax.shape == (n, v // group)
    assert torch.equal(gmax, rm)
    torch.testing.assert_close(lse, rl, rtol=8 * 2.0**-23, atol=0)
    diff = (grad.double() - rg.double()).abs()
    if dtype == torch.float32:
        bound = 16 * ULP[dtype] * (rg.double().abs() + coef.double()[:, None] * 2.0**-10)
    else:
        bound = ULP[dtype] * rg.double().abs().clamp_min(2.0**-24) * 2 + 2.0**-24
        assert (grad == rg).double().mean() >= 0.99
    assert bool((diff <= bound).all()), float((diff / bound).max())


def test_no_rows_launch_nothing(triton_device):
    z, y, coef = _inputs(0, 256, torch.bfloat16, triton_device)
    lse, grad, gmax = head_ce(z, y, coef, group=128, impl="triton")
    assert lse.shape == (0,) and grad.shape == (0, 256) and gmax.shape == (0, 2)


def test_refusals_name_the_fix():
    z, y, coef = _inputs(2, 100, torch.float32, "cpu")
    with pytest.raises(ValueError, match="multiple of group"):
        head_ce(z, y, coef, group=128, impl="torch")
    z, y, coef = _inputs(2, 256, torch.float32, "cpu")
    with pytest.raises(ValueError, match="resolved"):
        head_ce(z, y, coef, group=128, impl="auto")
    with pytest.raises(ValueError, match=r"z \[N, V\]"):
        head_ce(z, y[:1], coef, group=128, impl="torch")


def test_triton_refusals(triton_device):
    z, y, coef = _inputs(2, 256, torch.float32, triton_device)
    with pytest.raises(ValueError, match="coef fp32"):
        head_ce(z, y, coef.double(), group=128, impl="triton")
    with pytest.raises(ValueError, match="power-of-two"):
        head_ce(*_inputs(2, 192, torch.float32, triton_device), group=96, impl="triton")
    with pytest.raises(ValueError, match="no_grad"):
        head_ce(z.requires_grad_(True), y, coef, group=128, impl="triton")


def test_operator_registration(triton_device):
    """The opaque operator a compiled forward calls: its fake shapes and schema (`opcheck`)."""
    from dflash2.kernels.head_ce import _head_ce_op

    z, y, coef = _inputs(3, 256, torch.bfloat16, triton_device)
    torch.library.opcheck(_head_ce_op, (z, y, coef, 128), test_utils=("test_schema", "test_faketensor"))
