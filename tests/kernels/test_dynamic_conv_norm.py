"""Conv + residual + RMSNorm (`grouped_dynamic_conv_norm`): the reference is the conv with its
residual followed by Qwen3RMSNorm bit for bit; the Triton launch's `out` has the bits of the conv's
own Triton launch with the residual, and its `normed` matches the reference's norm of that `out`
within the STYLE.md item 6 bound, to the bit in nearly every 16-bit element; rows are independent;
bad inputs are refused."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.dynamic_conv import (_grouped_dynamic_conv_norm_triton, grouped_dynamic_conv,
                                          grouped_dynamic_conv_norm, grouped_dynamic_conv_reference,
                                          rms_norm_reference)

EPS = 1e-6

# (B, T, H, K, g, block_len, block_h): several blocks per sequence, batch > 1, odd H, T = 1; the
# chunk block_h None is the default (one chunk holding the row), a number forces several chunks,
# the last one partial where it does not divide H.
SHAPES = [
    (2, 12, 136, 3, 17, 4, None),
    (2, 12, 136, 3, 17, 4, 32),
    (1, 8, 48, 2, 16, 8, None),
    (3, 8, 40, 1, 40, 2, 16),
    (1, 1, 24, 2, 8, 1, None),
]
IDS = ["B{}-T{}-H{}-K{}-g{}-L{}-chunk{}".format(*s) for s in SHAPES]

# Units in the last place a 16-bit `normed` may differ by: where the mean's summation order moves
# r by an fp32 ulp across a rounding boundary of `out * r`, that value moves by one ulp, and the
# weight's product carries it (|w| ulps of the intermediate) into a second rounding: two ulps of
# the result at most (a CPU emulation of r moved by 1 fp32 ulp at H 4096 reached 2 ulps in 16 of
# 16.8 M elements).
MAX_ULPS = 2
# Elements of a 16-bit `normed` that must have the reference's bits: a last-bit fp32 difference in r
# crosses a 16-bit rounding boundary for about 2^-16 of the values per rounding; 0.97 leaves room
# for small rows and still fails a missing or extra rounding (about 0.8, see the test below).
SAME_BITS = 0.97
# fp32, relative: r differs by a few fp32 ulps (the mean's summation order, halved by the root; the
# root and quotient are correctly rounded on both sides) and each side rounds its two products
# once more (half an ulp each): 8 ulps (2^-23 each) leaves twice the measured 3 (the H200 at
# H 4096; 2.9 in the interpreter at H 136 to 4096).
FP32_RTOL = 8 * 2.0**-23
# fp32 floor of the item 6 bound (cases where torch is exact): a few ulps of the largest value.
FP32_ULPS = 8 * 2.0**-24


def _inputs(b, t, h, k, g, dtype, device):
    z = torch.randn(b, t, h, dtype=torch.float64)
    base = torch.randn(2, k, h, dtype=torch.float64)
    proj = torch.randn(b, t, 2 * k * (h // g), dtype=torch.float64)
    residual = 4 * torch.randn(b, t, h, dtype=torch.float64)
    weight = 1 + 0.1 * torch.randn(h, dtype=torch.float64)
    return [x.to(device=device, dtype=dtype) for x in (z, base, proj, residual, weight)]


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two 16-bit tensors (their bits as sign-magnitude integers;
    a sign change between nonzero values counts as far apart)."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    far = torch.full_like(ia, 1 << 16)
    ulps = torch.where((ia < 0) == (ib < 0), (ia - ib).abs(), far)
    return torch.where(a == b, torch.zeros_like(ulps), ulps)


def _assert_norm_close(normed, out, weight, error_within) -> None:
    """`normed` against the reference norm of the same `out`: the item 6 bound against fp64, and
    for 16-bit dtypes within MAX_ULPS everywhere and bit-identical in nearly every element."""
    ref = rms_norm_reference(out, weight, EPS)
    exact = rms_norm_reference(out.double(), weight.double(), EPS)
    floor = FP32_ULPS * exact.abs().max().item() if out.dtype == torch.float32 else 0.0
    error_within(normed.cpu(), ref.cpu(), exact.cpu(), floor)
    if out.dtype != torch.float32:
        ulps = _ulps(normed, ref)
        assert ulps.max().item() <= MAX_ULPS, f"{ulps.max().item()} ulps apart"
        same = (normed == ref).double().mean().item()
        assert same >= SAME_BITS, f"only {same:.3f} of the elements have the reference's bits"
    else:
        torch.testing.assert_close(normed, ref, rtol=FP32_RTOL, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("side", [0, 1])
def test_reference_is_the_conv_then_qwen3_rmsnorm(side, dtype) -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    z, base, proj, residual, weight = _inputs(2, 8, 48, 2, 16, dtype, "cpu")
    norm = Qwen3RMSNorm(48, eps=EPS).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        x = grouped_dynamic_conv_reference(z, base, proj, side, 4, 16, residual)
        expected = norm(x)
    out, normed = grouped_dynamic_conv_norm(z, base, proj, side, 4, 16, residual, weight, EPS, "torch")
    assert torch.equal(out, x) and torch.equal(normed, expected) and normed.dtype == dtype


def test_reference_on_fp64_computes_in_fp64() -> None:
    """The ground truth of the error checks: no step rounds to fp32."""
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    w = 1 + 0.1 * torch.randn(24, dtype=torch.float64)
    assert torch.equal(rms_norm_reference(x, w, EPS), w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
@pytest.mark.parametrize("side", [0, 1])
def test_triton_out_is_the_conv_launch_and_normed_the_reference(shape, side, dtype, triton_device,
                                                                error_within) -> None:
    b, t, h, k, g, L, block_h = shape
    z, base, proj, residual, weight = _inputs(b, t, h, k, g, dtype, triton_device)
    # NaN-poisoned outputs: every element must be written.
    poison = torch.full_like(z, float("nan"))
    out, normed = _grouped_dynamic_conv_norm_triton(z, base, proj, side, L, g, residual, weight, EPS,
                                                    block_h=block_h, out=poison, normed=poison.clone())
    conv = grouped_dynamic_conv(z, base, proj, side, L, g, "triton", residual=residual)
    assert out.dtype == normed.dtype == dtype and normed.shape == z.shape
    assert torch.equal(out, conv), "out differs from the conv's launch with the residual"
    _assert_norm_close(normed, out, weight, error_within)
    if dtype == torch.bfloat16:  # the whole op against the reference (its bf16 conv has the same bits here)
        ref_out, ref_normed = grouped_dynamic_conv_norm(z, base, proj, side, L, g, residual, weight, EPS, "torch")
        assert torch.equal(ref_out, out)
        assert (normed == ref_normed).double().mean().item() >= SAME_BITS


def test_public_triton_path_and_chunkings_agree(triton_device, error_within) -> None:
    # The default tiling (one chunk) and a chunked one: the same `out`; `normed` may differ only by
    # the sum's order, so each is checked against the reference.
    z, base, proj, residual, weight = _inputs(2, 8, 100, 2, 4, torch.bfloat16, triton_device)
    out, normed = grouped_dynamic_conv_norm(z, base, proj, 1, 4, 4, residual, weight, EPS, "triton")
    out2, normed2 = _grouped_dynamic_conv_norm_triton(z, base, proj, 1, 4, 4, residual, weight, EPS, block_h=32,
                                                      num_warps=1)
    assert torch.equal(out, out2)
    _assert_norm_close(normed, out, weight, error_within)
    _assert_norm_close(normed2, out, weight, error_within)


def test_a_row_gives_the_same_bits_alone_and_strided_inputs_are_read_in_place(triton_device) -> None:
    z, base, proj, residual, weight = _inputs(3, 8, 64, 2, 16, torch.bfloat16, triton_device)
    out, normed = grouped_dynamic_conv_norm(z, base, proj, 1, 4, 16, residual, weight, EPS, "triton")
    one = grouped_dynamic_conv_norm(z[1:2], base, proj[1:2], 1, 4, 16, residual[1:2], weight, EPS, "triton")
    assert torch.equal(one[0], out[1:2]) and torch.equal(one[1], normed[1:2])
    # every other channel of wider tensors, and a strided weight
    wide = [torch.randn(3, 8, 128, device=triton_device).bfloat16() for _ in range(2)]
    w_wide = (1 + 0.1 * torch.randn(128, device=triton_device)).bfloat16()
    args = (wide[0][..., ::2], base, proj, 1, 4, 16, wide[1][..., ::2], w_wide[::2], EPS, "triton")
    strided = grouped_dynamic_conv_norm(*args)
    dense = grouped_dynamic_conv_norm(*[a.contiguous() if isinstance(a, torch.Tensor) else a for a in args])
    assert torch.equal(strided[0], dense[0]) and torch.equal(strided[1], dense[1])


def test_the_16_bit_check_catches_a_missing_rounding(error_within) -> None:
    # Without the cast to bf16 before the weight's product (one rounding instead of two), the
    # result keeps its bits in only about 80 % of the elements: `_assert_norm_close` must refuse it.
    out = (4 * torch.randn(16, 512)).bfloat16()
    weight = (1 + 0.1 * torch.randn(512)).bfloat16()
    xf = out.float()
    one_rounding = (weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS))).bfloat16()
    with pytest.raises(AssertionError, match="reference's bits"):
        _assert_norm_close(one_rounding, out, weight, error_within)
    _assert_norm_close(rms_norm_reference(out, weight, EPS), out, weight, error_within)


def test_bad_inputs_raise(triton_device) -> None:
    z, base, proj, residual, weight = _inputs(1, 4, 16, 2, 8, torch.float32, triton_device)
    for impl in ("torch", "triton"):
        with pytest.raises(ValueError, match="norm_weight must be"):
            grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual, weight[:8], EPS, impl)
        with pytest.raises(ValueError, match="norm_weight must be"):
            grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual, weight.bfloat16(), EPS, impl)
        with pytest.raises(ValueError, match="residual must be"):
            grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual.bfloat16(), weight, EPS, impl)
        with pytest.raises(ValueError, match="residual must be"):
            grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual[:, :2], weight, EPS, impl)
        with pytest.raises(ValueError, match="needs the residual"):
            grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, None, weight, EPS, impl)
        with pytest.raises(ValueError, match="multiple of block_len"):
            grouped_dynamic_conv_norm(z, base, proj, 1, 3, 8, residual, weight, EPS, impl)
        with pytest.raises(ValueError, match="side must be"):
            grouped_dynamic_conv_norm(z, base, proj, 2, 4, 8, residual, weight, EPS, impl)
    with pytest.raises(ValueError, match="resolved"):
        grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual, weight, EPS, "auto")
    with pytest.raises(ValueError, match="use impl='torch'"):  # fp64: the kernel accumulates in fp32
        grouped_dynamic_conv_norm(*(x.double() for x in (z, base, proj)), 1, 4, 8, residual.double(),
                                  weight.double(), EPS, "triton")


def test_triton_refuses_grad(triton_device) -> None:
    z, base, proj, residual, weight = _inputs(1, 4, 16, 2, 8, torch.float32, triton_device)
    weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match="forward-only"):
        grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual, weight, EPS, "triton")
    with torch.no_grad():  # parameters keep requires_grad in inference; no graph -> allowed
        grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual, weight, EPS, "triton")
    # the reference is the training path
    out, normed = grouped_dynamic_conv_norm(z, base, proj, 1, 4, 8, residual, weight, EPS, "torch")
    normed.sum().backward()
    assert weight.grad is not None


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_gpu_real_shapes(batch, cuda_device, error_within) -> None:
    # Qwen3-8B draft: H 4096, g 16 (G 256), K 2, query block 16, bf16; the finish side.
    h, g, k, L = 4096, 16, 2, 16
    z, base, proj, residual, weight = _inputs(batch, 16, h, k, g, torch.bfloat16, cuda_device)
    out, normed = grouped_dynamic_conv_norm(z, base, proj, 1, L, g, residual, weight, EPS, "triton")
    assert torch.equal(out, grouped_dynamic_conv(z, base, proj, 1, L, g, "triton", residual=residual))
    _assert_norm_close(normed, out, weight, error_within)
    ref_out, ref_normed = grouped_dynamic_conv_norm(z, base, proj, 1, L, g, residual, weight, EPS, "torch")
    # the reference's own conv (PyTorch ops) may round an element differently; its norm is the check
    assert (out == ref_out).double().mean().item() >= SAME_BITS
    same = (normed == ref_normed).double().mean().item()
    assert same >= SAME_BITS, f"only {same:.3f} of the elements have the reference's bits"
