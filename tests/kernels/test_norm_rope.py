"""Norm-RoPE (`dflash2.kernels.norm_rope`): the reference is the draft attention's own ops bit for
bit; the Triton kernel (the interpreter on CPU) matches it within the STYLE.md item 6 bound, to
the bit in nearly every element, writes keys and values into a cache at each token's slot (and
nowhere else), is row-local, and refuses what it does not take."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.norm_rope import (fits, norm_rope, norm_rope_into_cache, norm_rope_queries_and_cache,
                                      norm_rope_reference, scatter_reference)

EPS = 1e-6


def _rope_tables(B, S, hd, dtype, device, offset=0):
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    pos = torch.arange(S, dtype=torch.float32)[None].repeat(B, 1) + offset + 7 * torch.arange(B)[:, None]
    ang = pos[..., None] * inv
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


def _operands(B, S, H, hd, dtype, device):
    x = (torch.randn(B, S, H, hd) * 3).to(dtype).to(device)
    w = (1 + 0.1 * torch.randn(hd)).to(dtype).to(device)
    cos, sin = _rope_tables(B, S, hd, dtype, device)
    return x, w, cos, sin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_reference_is_the_draft_attentions_own_ops(dtype):
    from dflash2.modeling.draft import _rope
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x, w, cos, sin = _operands(2, 5, 4, 32, dtype, "cpu")
    norm = Qwen3RMSNorm(32, eps=EPS).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        module = _rope(norm(x).transpose(1, 2), cos, sin)
    assert torch.equal(norm_rope_reference(x, w, EPS, cos, sin), module)


def test_reference_on_fp64_operands_computes_in_fp64():
    """The ground truth of the error checks below: no step of it rounds to fp32 (a mean and root
    rounded to fp32 there would put torch's own root into the truth and count only the kernel's)."""
    from dflash2.kernels.norm_rope.reference import rotate_half

    x, w, cos, sin = _operands(2, 5, 4, 32, torch.float64, "cpu")
    y = (w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))).transpose(1, 2)
    assert torch.equal(norm_rope_reference(x, w, EPS, cos, sin), y * cos[:, None] + rotate_half(y) * sin[:, None])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("B, S, H, hd", [(1, 16, 4, 32), (3, 5, 3, 16), (2, 1, 8, 64)])
def test_kernel_matches_the_reference(B, S, H, hd, dtype, triton_device, error_within):
    x, w, cos, sin = _operands(B, S, H, hd, dtype, triton_device)
    out = norm_rope(x, w, EPS, cos, sin, impl="triton")
    ref = norm_rope_reference(x, w, EPS, cos, sin)
    assert out.shape == (B, H, S, hd) and out.dtype == dtype and out.is_contiguous()
    exact = norm_rope_reference(x.double(), w.double(), EPS, cos.double(), sin.double())
    error_within(out.cpu(), ref.cpu(), exact.cpu(), floor=0.0)
    if dtype != torch.float32:  # in fp32 the mean's order moves most last bits; a 16-bit rounding hides it
        same = (out == ref).float().mean().item()
        assert same >= 0.97, f"only {same:.3f} of the elements have the reference's bits"
        ulp = 2.0 ** -7  # bf16: one unit in the last place, relative
        assert ((out.float() - ref.float()).abs() <= ulp * ref.float().abs() + 1e-30).all()


def test_a_row_gives_the_same_bits_alone_and_strided_input_is_read_in_place(triton_device):
    x, w, cos, sin = _operands(3, 6, 4, 32, torch.bfloat16, triton_device)
    full = norm_rope(x, w, EPS, cos, sin, impl="triton")
    assert torch.equal(norm_rope(x[1:2], w, EPS, cos[1:2], sin[1:2], impl="triton"), full[1:2])
    # A slice of a wider projection output (as q/k/v fused into one matrix give): last dim contiguous.
    wide = torch.randn(3, 6, 3 * 4 * 32, dtype=torch.bfloat16, device=triton_device)
    part = wide[..., 128:256].unflatten(-1, (4, 32))
    assert part.stride(-1) == 1 and not part.is_contiguous()
    assert torch.equal(norm_rope(part, w, EPS, cos, sin, impl="triton"),
                       norm_rope(part.contiguous(), w, EPS, cos, sin, impl="triton"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_into_cache_writes_each_tokens_slot_and_nothing_else(dtype, triton_device):
    B, S, H, hd, L = 2, 4, 2, 32, 12
    k, w, cos, sin = _operands(B, S, H, hd, dtype, triton_device)
    v = torch.randn(B, S, H, hd, dtype=dtype, device=triton_device)
    slots = torch.tensor([[3, 4, 5, 6], [0, 1, 2, 11]], device=triton_device)
    fill = torch.full((B, H, L, hd), 7.0, dtype=dtype, device=triton_device)
    kc, vc = fill.clone(), fill.clone()
    norm_rope_into_cache(k, v, w, EPS, cos, sin, kc, vc, slots, impl="triton")
    kr, vr = fill.clone(), fill.clone()
    norm_rope_into_cache(k, v, w, EPS, cos, sin, kr, vr, slots, impl="torch")
    assert torch.equal(vc, vr)  # values are copied exactly
    written = torch.zeros(B, L, dtype=torch.bool)
    written[torch.arange(B)[:, None], slots.cpu()] = True
    assert torch.equal(kc.cpu()[~written[:, None, :, None].expand_as(kc.cpu())],
                       fill.cpu()[~written[:, None, :, None].expand_as(fill.cpu())])  # other slots untouched
    tol = 2.0 ** -7 if dtype == torch.bfloat16 else 1e-5
    assert (kc.float() - kr.float()).abs().max() <= tol * kr.float().abs().max()
    # the same keys as the fresh-tensor path, scattered
    direct = fill.clone()
    scatter_reference(direct, norm_rope(k, w, EPS, cos, sin, impl="triton"), slots)
    assert torch.equal(kc, direct)


@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_queries_and_cache_in_one_launch_give_the_two_launches_bits(dtype, impl, triton_device):
    """The attention's shape in small: more query heads than key heads, the keys of context and
    block (more tokens than queries) into the cache, other weights, eps and RoPE rows per side."""
    B, S_q, S_k, H_q, H_k, hd, L = 2, 3, 5, 4, 2, 32, 9
    q, wq, qcos, qsin = _operands(B, S_q, H_q, hd, dtype, triton_device)
    k, wk, kcos, ksin = _operands(B, S_k, H_k, hd, dtype, triton_device)
    kcos, ksin = kcos.flip(1), ksin.flip(1)
    v = torch.randn(B, S_k, H_k, hd, dtype=dtype, device=triton_device)
    slots = torch.tensor([[0, 1, 2, 6, 7], [3, 4, 5, 6, 8]], device=triton_device)
    fill = torch.full((B, H_k, L, hd), 7.0, dtype=dtype, device=triton_device)
    kc, vc, kr, vr = fill.clone(), fill.clone(), fill.clone(), fill.clone()
    Q = norm_rope_queries_and_cache(q, wq, 1e-5, qcos, qsin, k, v, wk, EPS, kcos, ksin, kc, vc, slots, impl=impl)
    norm_rope_into_cache(k, v, wk, EPS, kcos, ksin, kr, vr, slots, impl=impl)
    assert torch.equal(Q, norm_rope(q, wq, 1e-5, qcos, qsin, impl=impl)) and Q.shape == (B, H_q, S_q, hd)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    assert not torch.equal(kc, fill)  # the cache launch wrote


def test_queries_and_cache_refuse_mismatched_sides(triton_device):
    q, w, cos, sin = _operands(2, 3, 4, 32, torch.float32, triton_device)
    k, wk, kcos, ksin = _operands(1, 3, 2, 32, torch.float32, triton_device)
    kc = torch.zeros(1, 2, 8, 32, device=triton_device)
    with pytest.raises(ValueError, match="must share B, hd and dtype"):
        norm_rope_queries_and_cache(q, w, EPS, cos, sin, k, k, wk, EPS, kcos, ksin, kc, kc.clone(),
                                    torch.zeros(1, 3, dtype=torch.long, device=triton_device), impl="triton")


def test_a_slot_outside_the_cache_is_dropped(triton_device):
    k, w, cos, sin = _operands(1, 2, 2, 16, torch.float32, triton_device)
    kc = torch.zeros(1, 2, 4, 16, device=triton_device)
    vc = torch.zeros_like(kc)
    norm_rope_into_cache(k, k, w, EPS, cos, sin, kc, vc, torch.tensor([[1, 9]], device=triton_device), impl="triton")
    assert kc[:, :, 1].abs().sum() > 0 and kc[:, :, [0, 2, 3]].abs().sum() == 0 and vc[:, :, [0, 2, 3]].abs().sum() == 0


def test_refusals_name_the_fix(triton_device):
    x, w, cos, sin = _operands(1, 3, 2, 32, torch.float32, triton_device)
    assert fits(x, w, cos) and not fits(x[..., :24], w[:24], cos[..., :24])  # hd / 2 = 12: not a power of two
    with pytest.raises(ValueError, match="use impl='torch'"):
        norm_rope(x[..., :24], w[:24], EPS, cos[..., :24], sin[..., :24], impl="triton")
    with pytest.raises(ValueError, match="expected \\[B, S, hd\\]"):
        norm_rope(x, w, EPS, cos[:, :2], sin, impl="triton")
    with pytest.raises(ValueError, match="inference-only"):
        norm_rope(x.requires_grad_(), w, EPS, cos, sin, impl="triton")
    with pytest.raises(ValueError, match="resolved"):
        norm_rope(x, w, EPS, cos, sin, impl="auto")
    x = x.detach()
    with pytest.raises(ValueError, match="slots"):
        kc = torch.zeros(1, 2, 8, 32, device=triton_device)
        norm_rope_into_cache(x, x, w, EPS, cos, sin, kc, kc.clone(), torch.zeros(1, 2, dtype=torch.long,
                                                                                   device=triton_device), impl="triton")
