"""Grouped dynamic depthwise causal conv of DFlash2 (spec 4.2-4.3): prepare / finish sides.

`grouped_dynamic_conv`: one side, optionally with the layer's residual add in its epilogue.
`grouped_dynamic_conv_norm`: the finish side with its residual add and the next sublayer's
RMSNorm (Qwen3RMSNorm) of the result, in one launch with ``impl="triton"``.
"""

from __future__ import annotations

import torch

from dflash2.kernels.dynamic_conv.reference import (grouped_dynamic_conv_norm_reference,
                                                    grouped_dynamic_conv_reference, rms_norm_reference)

try:
    from dflash2.kernels.dynamic_conv import triton_kernels as _tk
    from dflash2.kernels.rounding import ROUNDING_KIND as _KIND  # the kernel's rounding of each dtype
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["grouped_dynamic_conv", "grouped_dynamic_conv_norm", "grouped_dynamic_conv_reference",
           "grouped_dynamic_conv_norm_reference", "rms_norm_reference"]

# Tile: 4 tokens x 256 channels, 4 warps (8 elements a thread), the tiling sweep's pick at batch
# 1/8/32 (`benchmarks.kernels --sweep`; more, smaller programs hide the load latency).
_BLOCK_T = 4
_BLOCK_H = 256
# Conv + norm: one program per token row; a row of up to _NORM_BLOCK_H channels is one chunk that
# stays in registers between the conv and the norm (H 4096: 16 fp32 values a thread at 8 warps).
_NORM_BLOCK_H = 4096


def _check(z: torch.Tensor, base: torch.Tensor, proj: torch.Tensor, side: int, block_len: int, group_size: int,
           residual: torch.Tensor | None = None) -> None:
    if z.dim() != 3:
        raise ValueError(f"z must be [B, T, H], got {tuple(z.shape)}")
    bsz, seq, hidden = z.shape
    if base.dim() != 3 or base.shape[0] != 2 or base.shape[2] != hidden:
        raise ValueError(f"base must be [2, K, H={hidden}], got {tuple(base.shape)}")
    if group_size <= 0 or hidden % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide H={hidden}")
    taps = base.shape[1]
    groups = hidden // group_size
    if tuple(proj.shape) != (bsz, seq, 2 * taps * groups):
        raise ValueError(f"proj must be [B, T, 2*K*G] = {(bsz, seq, 2 * taps * groups)}, got {tuple(proj.shape)}")
    if side not in (0, 1):
        raise ValueError(f"side must be 0 (prepare) or 1 (finish), got {side}")
    if block_len <= 0 or seq % block_len != 0:
        raise ValueError(f"T={seq} must be a multiple of block_len={block_len}")
    if residual is not None and (residual.shape != z.shape or residual.dtype != z.dtype):
        raise ValueError(f"residual must be [B, T, H] = {tuple(z.shape)} in {z.dtype}, "
                         f"got {tuple(residual.shape)} in {residual.dtype}")


def _grouped_dynamic_conv_triton(
    z: torch.Tensor,
    base: torch.Tensor,
    proj: torch.Tensor,
    side: int,
    block_len: int,
    group_size: int,
    block_h: int = _BLOCK_H,
    num_warps: int = 4,
    block_t: int = _BLOCK_T,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    _refuse_grad("grouped_dynamic_conv", (z, base, proj) + (() if residual is None else (residual,)))
    bsz, seq, hidden = z.shape
    taps = base.shape[1]
    out = torch.empty_like(z) if out is None else out
    if z.numel() == 0:
        return out
    grid = (_cdiv(seq, block_t), _cdiv(hidden, block_h), bsz)
    res = out if residual is None else residual  # an unread stand-in without a residual
    _tk._grouped_dynamic_conv_fwd[grid](
        z, base, proj, out, res,
        seq, hidden, block_len, side,
        *z.stride(), *base.stride(), *proj.stride(), *out.stride(), *res.stride(),
        K=taps, G=hidden // group_size, GROUP=group_size,
        BLOCK_T=block_t, BLOCK_H=block_h, HAS_RES=residual is not None, KIND=_KIND.get(z.dtype, 0),
        num_warps=num_warps,
    )
    return out


def _refuse_grad(name: str, tensors: tuple[torch.Tensor, ...]) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{name}(impl='triton') is forward-only and refuses inputs that require "
            "grad while autograd is recording; train with impl='torch' or call it under "
            "torch.no_grad() / torch.inference_mode()."
        )


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _check_norm(z: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor) -> None:
    if residual is None:
        raise ValueError("grouped_dynamic_conv_norm needs the residual [B, T, H]")
    hidden = z.shape[-1]
    if tuple(norm_weight.shape) != (hidden,) or norm_weight.dtype != z.dtype:
        raise ValueError(f"norm_weight must be [H={hidden}] in {z.dtype}, "
                         f"got {tuple(norm_weight.shape)} in {norm_weight.dtype}")


def _grouped_dynamic_conv_norm_triton(
    z: torch.Tensor,
    base: torch.Tensor,
    proj: torch.Tensor,
    side: int,
    block_len: int,
    group_size: int,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    block_h: int | None = None,
    num_warps: int | None = None,
    out: torch.Tensor | None = None,
    normed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one launch of `grouped_dynamic_conv_norm`; `block_h` (a power of two) and `num_warps`
    override the tiling, `out` / `normed` (`[B, T, H]` of z's dtype) the outputs' buffers."""
    _refuse_grad("grouped_dynamic_conv_norm", (z, base, proj, residual, norm_weight))
    if z.dtype not in _KIND:
        raise ValueError(f"grouped_dynamic_conv_norm(impl='triton') takes {tuple(_KIND)}, got {z.dtype}; "
                         "use impl='torch'")
    bsz, seq, hidden = z.shape
    out = torch.empty_like(z) if out is None else out
    normed = torch.empty_like(z) if normed is None else normed
    for name, t in (("out", out), ("normed", normed)):
        if t.shape != z.shape or t.dtype != z.dtype:
            raise ValueError(f"{name} must be [B, T, H] = {tuple(z.shape)} in {z.dtype}, "
                             f"got {tuple(t.shape)} in {t.dtype}")
    if z.numel() == 0:
        return out, normed
    if block_h is None:
        block_h = min(_NORM_BLOCK_H, 1 << max(hidden - 1, 0).bit_length())
    if num_warps is None:
        num_warps = 4 if block_h <= 1024 else 8
    _tk._grouped_dynamic_conv_norm_fwd[(seq, bsz)](
        z, base, proj, residual, norm_weight, out, normed,
        seq, hidden, block_len, side, float(eps),
        *z.stride(), *base.stride(), *proj.stride(), *residual.stride(), norm_weight.stride(0),
        *out.stride(), *normed.stride(),
        K=base.shape[1], G=hidden // group_size, GROUP=group_size,
        BLOCK_H=block_h, CHUNKS=_cdiv(hidden, block_h), KIND=_KIND[z.dtype],
        num_warps=num_warps,
    )
    return out, normed


def grouped_dynamic_conv(
    z: torch.Tensor,
    base: torch.Tensor,
    proj: torch.Tensor,
    side: int,
    block_len: int,
    group_size: int,
    impl: str,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One application (prepare or finish) of the grouped dynamic causal conv.

    ``out[b,i,c] = sum_t [i mod block_len >= t] (base[side,t,c] + proj[b,i,side*K*G + t*G + c//g]) z[b,i-t,c]``

    With ``residual``, returns ``residual + out`` computed as PyTorch adds two tensors of
    ``z.dtype`` (``out`` rounded first): the same bits as this call without it followed by the add,
    in one launch (``"triton"``).

    Args:
        z: ``[B, T, H]`` input (the normed sublayer input for side 0, its output for side 1).
        base: ``[2, K, H]`` the ``base_kernel`` parameter (axis 0 = side, axis 1 = tap).
        proj: ``[B, T, 2*K*G]`` the ``kernel_projection`` output, flat row index
            ``side*K*G + t*G + group`` with ``G = H / group_size``.
        side: 0 (prepare) or 1 (finish).
        block_len: conv block length; ``T % block_len == 0``; taps never cross a block boundary.
        group_size: channels per kernel group ``g`` (must divide ``H``).
        impl: ``"torch"`` (differentiable reference) or ``"triton"`` (forward only; refuses
            inputs that require grad while grad mode is on), already resolved by
            :func:`dflash2.kernels.dispatch.resolve_impl`.

        residual: optional ``[B, T, H]`` in ``z.dtype``, added to the output (the draft layer's
            residual stream, after the finish side).
        out: optional ``[B, T, H]`` tensor of ``z.dtype`` (any strides, e.g. the block rows of a
            buffer that also holds other rows) that receives the result and is returned; it must
            not overlap the inputs. Default: a new tensor.

    Returns:
        ``[B, T, H]`` in ``z.dtype``, accumulated in fp32 (``out`` if given).
    """
    _check(z, base, proj, side, block_len, group_size, residual)
    if out is not None and (out.shape != z.shape or out.dtype != z.dtype):
        raise ValueError(f"out must be [B, T, H] = {tuple(z.shape)} in {z.dtype}, "
                         f"got {tuple(out.shape)} in {out.dtype}")
    if impl == "torch":
        ref = grouped_dynamic_conv_reference(z, base, proj, side, block_len, group_size, residual)
        return ref if out is None else out.copy_(ref)
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _grouped_dynamic_conv_triton(z, base, proj, side, block_len, group_size, residual=residual, out=out)
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")


def grouped_dynamic_conv_norm(
    z: torch.Tensor,
    base: torch.Tensor,
    proj: torch.Tensor,
    side: int,
    block_len: int,
    group_size: int,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A conv side with the residual add, and the RMSNorm of the result: a draft sublayer's end
    and the next sublayer's input norm (one launch with ``"triton"``).

    ``out = residual + conv(z)`` exactly as ``grouped_dynamic_conv(z, base, proj, side, block_len,
    group_size, impl, residual=residual)`` returns it; ``normed = norm_weight * (out * rsqrt(
    mean(out^2) + eps)).to(dtype)``, the mean and root in fp32, as ``Qwen3RMSNorm`` computes it
    (:func:`rms_norm_reference`).

    Guarantees of ``"triton"`` (bf16, fp16, fp32): ``out`` has the bits of the conv's own Triton
    launch with the residual (the same tile function); ``normed`` rounds where the reference
    rounds, so it differs from it only through the order of the mean's fp32 sum (a tree within
    each chunk of the row, the chunks in order) and, in 16-bit dtypes on the GPU, the approximate
    rsqrt's last bit (torch's CUDA rsqrt is approximate too): in bf16 / fp16 within two units in
    the last place (one fp32 ulp of the inverse root can move both roundings) and bit-identical in
    nearly every element; in fp32 within a few ulps (the
    inverse root correctly rounded). Each
    row's result depends on that row alone (one program per token). No host sync and no device
    value read on the host (CUDA-graph safe); forward only (refuses inputs that require grad
    while grad mode is on).

    Args:
        z, base, proj, side, block_len, group_size: as :func:`grouped_dynamic_conv`.
        residual: ``[B, T, H]`` in ``z.dtype``.
        norm_weight: ``[H]`` in ``z.dtype``, the RMSNorm's weight.
        eps: the RMSNorm's epsilon (``variance_epsilon``).
        impl: ``"torch"`` (differentiable reference) or ``"triton"``, already resolved.

    Returns:
        ``(out, normed)``, both ``[B, T, H]`` in ``z.dtype``.
    """
    _check(z, base, proj, side, block_len, group_size, residual)
    _check_norm(z, residual, norm_weight)
    if impl == "torch":
        return grouped_dynamic_conv_norm_reference(z, base, proj, side, block_len, group_size, residual,
                                                   norm_weight, eps)
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _grouped_dynamic_conv_norm_triton(z, base, proj, side, block_len, group_size, residual, norm_weight,
                                                 eps)
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")
