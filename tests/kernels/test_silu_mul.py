"""`silu_mul` (the draft MLP's SwiGLU product) against eager `F.silu(gate) * up`.

Tolerance: the kernel does the reference's arithmetic (fp32 on the widened operands, the SiLU
rounded to the dtype, then the product rounded); only the fp32 `exp` may differ in its last bit,
which moves the rounded SiLU by at most one ulp of the dtype on an element that sits on a rounding
boundary, and the product by that ulp times |up| plus its own rounding. fp32 outputs are checked
within a few fp32 ulps; 16-bit outputs within one ulp of the dtype at the output's magnitude, and
equal on at least 99 % of the elements.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dflash2.kernels.silu_mul import silu_mul, silu_mul_reference

ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-23}


def _operands(rows: int, cols: int, dtype: torch.dtype, device: str, fused: bool):
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    gu = (torch.randn(rows, 2 * cols, generator=g) * 3).to(dtype).to(device)
    if fused:  # column slices of one [rows, 2I] output, as the fused gate/up launch leaves them
        return gu[:, :cols], gu[:, cols:]
    return gu[:, :cols].contiguous(), gu[:, cols:].contiguous()


def test_reference_is_eager_pytorch():
    g, u = _operands(5, 40, torch.bfloat16, "cpu", fused=False)
    assert torch.equal(silu_mul_reference(g, u), F.silu(g) * u)
    assert torch.equal(silu_mul(g, u, impl="torch"), F.silu(g) * u)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("rows,cols,fused", [(1, 7, False), (3, 1500, True), (16, 2048, True)])
def test_triton_matches_the_reference(triton_device, dtype, rows, cols, fused):
    g, u = _operands(rows, cols, dtype, triton_device, fused)
    with torch.no_grad():
        out = silu_mul(g, u, impl="triton")
    ref = silu_mul_reference(g, u)
    assert out.shape == ref.shape and out.dtype == dtype and out.is_contiguous()
    diff = (out.double() - ref.double()).abs()
    bound = 4 * ULP[dtype] * ref.double().abs().clamp_min(2.0**-14) + 1e-30
    assert bool((diff <= bound).all()), float((diff / bound).max())
    if dtype != torch.float32:  # fp32 keeps the exp's last bit; a 16-bit rounding almost always hides it
        assert (out == ref).double().mean() >= 0.99


def test_triton_keeps_leading_dims(triton_device):
    g, u = _operands(6, 64, torch.float32, triton_device, fused=True)
    with torch.no_grad():
        out = silu_mul(g.view(2, 3, 64), u.view(2, 3, 64), impl="triton")
    assert out.shape == (2, 3, 64)
    torch.testing.assert_close(out.view(6, 64), silu_mul_reference(g, u))


def test_bad_inputs_raise():
    g = torch.randn(2, 8)
    with pytest.raises(ValueError, match="must match"):
        silu_mul(g, torch.randn(2, 9), impl="torch")
    with pytest.raises(ValueError, match="resolved"):
        silu_mul(g, g, impl="auto")


@pytest.mark.gpu
def test_gpu_8b_shape():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g, u = _operands(16, 12288, torch.bfloat16, "cuda", fused=True)
    with torch.no_grad():
        out = silu_mul(g, u, impl="triton")
    ref = silu_mul_reference(g, u)
    assert (out == ref).double().mean() >= 0.99
    torch.testing.assert_close(out, ref, rtol=2 * ULP[torch.bfloat16], atol=0)
