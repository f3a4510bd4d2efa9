"""Grouped dynamic conv: reference vs an explicit loop; Triton vs reference; grad refusal."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.dynamic_conv import (_grouped_dynamic_conv_triton, grouped_dynamic_conv,
                                          grouped_dynamic_conv_reference)
from tests.formulas import conv_loop

# (B, T, H, K, g, block_len): odd H, non power-of-two groups, several blocks, T = 1 decode.
SHAPES = [
    (2, 10, 48, 2, 16, 5),
    (1, 7, 30, 3, 3, 7),
    (3, 8, 40, 1, 40, 4),
    (1, 1, 24, 2, 8, 1),
    (2, 12, 136, 3, 17, 4),
]
IDS = ["B{}-T{}-H{}-K{}-g{}-L{}".format(*s) for s in SHAPES]

# bf16 output: the fp32 sum is rounded once to bf16 by either implementation, so both errors are
# about half a bf16 ulp of |out| (2^-9 relative); the floor covers an fp32-order difference
# flipping one rounding, i.e. one bf16 ulp of the largest output.
BF16_ULP = 2.0**-8
# fp32: both sum K <= 3 products in fp32; differences are a few fp32 ulps of the largest term.
FP32_ULPS = 8 * 2.0**-24


def _inputs(b, t, h, k, g, dtype, device="cpu"):
    z = torch.randn(b, t, h, dtype=torch.float64)
    base = torch.randn(2, k, h, dtype=torch.float64)
    proj = torch.randn(b, t, 2 * k * (h // g), dtype=torch.float64)
    return [x.to(device=device, dtype=dtype) for x in (z, base, proj)]


@pytest.mark.parametrize("shape", SHAPES[:4], ids=IDS[:4])
@pytest.mark.parametrize("side", [0, 1])
def test_reference_matchesconv_loop(shape, side) -> None:
    b, t, h, k, g, L = shape
    z, base, proj = _inputs(b, t, h, k, g, torch.float64)
    out = grouped_dynamic_conv_reference(z, base, proj, side, L, g)
    torch.testing.assert_close(out, conv_loop(z, base, proj, side, L, g), rtol=1e-12, atol=1e-12)


def test_block_boundary_zeroes_taps() -> None:
    # z = 1 everywhere, base taps 1, no projection: out = number of taps inside the block.
    z = torch.ones(1, 8, 4, dtype=torch.float64)
    base = torch.ones(2, 3, 4, dtype=torch.float64)
    proj = torch.zeros(1, 8, 2 * 3 * 1, dtype=torch.float64)
    out = grouped_dynamic_conv_reference(z, base, proj, 0, 4, 4)
    assert out[0, :, 0].tolist() == [1, 2, 3, 3, 1, 2, 3, 3]


def test_reference_is_differentiable() -> None:
    z, base, proj = _inputs(1, 6, 8, 2, 4, torch.float64)
    for x in (z, base, proj):
        x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b, c: grouped_dynamic_conv_reference(a, b, c, 1, 3, 4), (z, base, proj))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("side", [0, 1])
def test_triton_matches_reference(shape, side, dtype, triton_device, error_within) -> None:
    b, t, h, k, g, L = shape
    z, base, proj = _inputs(b, t, h, k, g, dtype, triton_device)
    out = grouped_dynamic_conv(z, base, proj, side, L, g, "triton")
    ref = grouped_dynamic_conv(z, base, proj, side, L, g, "torch")
    exact = grouped_dynamic_conv_reference(z.double(), base.double(), proj.double(), side, L, g)
    assert out.dtype == dtype and out.shape == z.shape
    floor = (BF16_ULP if dtype == torch.bfloat16 else FP32_ULPS) * exact.abs().max().item()
    error_within(out, ref, exact, floor)


@pytest.mark.parametrize("tiling", [(4, 32, 1), (2, 256, 2)], ids=["t4-h32", "t2-h256"])
def test_triton_tilings(tiling, triton_device, error_within) -> None:
    # Token tiles that split blocks and channel tiles that split groups.
    z, base, proj = _inputs(2, 12, 136, 3, 17, torch.float32, triton_device)
    block_t, block_h, warps = tiling
    out = _grouped_dynamic_conv_triton(z, base, proj, 1, 4, 17, block_h=block_h, num_warps=warps, block_t=block_t)
    ref = grouped_dynamic_conv(z, base, proj, 1, 4, 17, "torch")
    exact = grouped_dynamic_conv_reference(z.double(), base.double(), proj.double(), 1, 4, 17)
    error_within(out, ref, exact, FP32_ULPS * exact.abs().max().item())


def test_triton_strided_input(triton_device) -> None:
    # z as a non-contiguous view (every other channel of a wider tensor).
    z_wide = torch.randn(2, 8, 64, device=triton_device)
    z = z_wide[..., ::2]
    base = torch.randn(2, 2, 32, device=triton_device)
    proj = torch.randn(2, 8, 2 * 2 * 4, device=triton_device)
    out = grouped_dynamic_conv(z, base, proj, 1, 4, 8, "triton")
    ref = grouped_dynamic_conv(z, base, proj, 1, 4, 8, "torch")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_out_receives_the_result_in_place(impl, triton_device) -> None:
    # `out` as the last rows of a wider buffer (the draft's [context; block] rows): the same values
    # as a fresh output, written there and returned; the other rows untouched.
    z, base, proj = _inputs(2, 8, 32, 2, 8, torch.float32, triton_device)
    buf = torch.full((2, 11, 32), 7.0, device=triton_device)
    rows = buf[:, 3:]
    got = grouped_dynamic_conv(z, base, proj, 0, 4, 8, impl, out=rows)
    assert got.data_ptr() == rows.data_ptr()
    assert torch.equal(buf[:, 3:], grouped_dynamic_conv(z, base, proj, 0, 4, 8, impl))
    assert bool((buf[:, :3] == 7.0).all())
    with pytest.raises(ValueError, match="out must be"):
        grouped_dynamic_conv(z, base, proj, 0, 4, 8, impl, out=buf[:, 2:])


def test_triton_refuses_grad(triton_device) -> None:
    z, base, proj = _inputs(1, 4, 16, 2, 8, torch.float32, triton_device)
    base.requires_grad_(True)
    with pytest.raises(RuntimeError, match="forward-only"):
        grouped_dynamic_conv(z, base, proj, 0, 4, 8, "triton")
    with torch.no_grad():  # parameters keep requires_grad in inference; no graph -> allowed
        grouped_dynamic_conv(z, base, proj, 0, 4, 8, "triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_triton_residual_is_the_separate_add_bit_for_bit(shape, dtype, triton_device) -> None:
    # The draft layer's finish side with its residual in one launch: the same bits as the conv
    # alone followed by PyTorch's add (the conv rounded first, the sum rounded once).
    b, t, h, k, g, L = shape
    z, base, proj = _inputs(b, t, h, k, g, dtype, triton_device)
    residual = (4 * torch.randn(b, t, h, dtype=torch.float64)).to(device=triton_device, dtype=dtype)
    fused = grouped_dynamic_conv(z, base, proj, 1, L, g, "triton", residual=residual)
    separate = residual + grouped_dynamic_conv(z, base, proj, 1, L, g, "triton")
    assert fused.dtype == dtype and torch.equal(fused, separate)
    ref = grouped_dynamic_conv(z, base, proj, 1, L, g, "torch", residual=residual)
    assert torch.equal(ref, residual + grouped_dynamic_conv(z, base, proj, 1, L, g, "torch"))


def test_triton_residual_refuses_grad_and_bad_shapes(triton_device) -> None:
    z, base, proj = _inputs(1, 4, 16, 2, 8, torch.float32, triton_device)
    residual = torch.randn(1, 4, 16, device=triton_device, requires_grad=True)
    with pytest.raises(RuntimeError, match="forward-only"):
        grouped_dynamic_conv(z, base, proj, 1, 4, 8, "triton", residual=residual)
    with pytest.raises(ValueError, match="residual must be"):
        grouped_dynamic_conv(z, base, proj, 1, 4, 8, "triton", residual=residual.detach()[:, :2])
    with pytest.raises(ValueError, match="residual must be"):
        grouped_dynamic_conv(z, base, proj, 1, 4, 8, "torch", residual=residual.detach().double())


def test_bad_shapes_raise() -> None:
    z, base, proj = _inputs(1, 6, 16, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="multiple of block_len"):
        grouped_dynamic_conv(z, base, proj, 0, 4, 8, "torch")
    with pytest.raises(ValueError, match="must divide"):
        grouped_dynamic_conv(z, base, proj, 0, 3, 5, "torch")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_real_shapes(batch, dtype, cuda_device, error_within) -> None:
    # Qwen3-8B draft: H 4096, g 16 (G 256), K 2, query block 16.
    h, g, k, L = 4096, 16, 2, 16
    z, base, proj = _inputs(batch, 16, h, k, g, dtype, cuda_device)
    for side in (0, 1):
        out = grouped_dynamic_conv(z, base, proj, side, L, g, "triton")
        ref = grouped_dynamic_conv(z, base, proj, side, L, g, "torch")
        exact = grouped_dynamic_conv_reference(z.double(), base.double(), proj.double(), side, L, g)
        floor = (BF16_ULP if dtype == torch.bfloat16 else FP32_ULPS) * exact.abs().max().item()
        error_within(out, ref, exact, floor)
