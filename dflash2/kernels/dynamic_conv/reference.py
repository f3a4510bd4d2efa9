"""Grouped dynamic depthwise causal conv (spec section 4.2): obviously-right PyTorch.

    out[b, i, c] = sum_{t < K} [i mod L >= t] * (base[side, t, c] + proj[b, i, side, t, c // g])
                                              * z[b, i - t, c]

This is the CPU path and the training (autograd) path; it accumulates in fp32 (fp64 for fp64
inputs, which the tests use as ground truth) and returns ``z.dtype``. The finish side followed by
the next sublayer's RMSNorm (`grouped_dynamic_conv_norm_reference`) is this conv with its
residual, then Qwen3RMSNorm's own ops (`rms_norm_reference`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_dynamic_conv_reference(
    z: torch.Tensor,
    base: torch.Tensor,
    proj: torch.Tensor,
    side: int,
    block_len: int,
    group_size: int,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Differentiable reference of :func:`dflash2.kernels.dynamic_conv.grouped_dynamic_conv`
    (with `residual`: `residual + conv`, the conv rounded to `z.dtype` first)."""
    bsz, seq, hidden = z.shape
    taps = base.shape[1]
    groups = hidden // group_size
    acc = torch.promote_types(z.dtype, torch.float32)
    # this side's per-token kernel offsets, one per group: [B, T, K, G, 1]
    delta = proj.reshape(bsz, seq, 2, taps, groups)[:, :, side].to(acc).unsqueeze(-1)
    weight = base[side].to(acc)  # [K, H]
    zf = z.to(acc)
    in_block = torch.arange(seq, device=z.device) % block_len  # [T]
    out = torch.zeros_like(zf)
    for t in range(taps):
        shifted = F.pad(zf, (0, 0, t, 0))[:, :seq]  # z[b, i - t, c], zero for i < t
        keep = (in_block >= t).to(acc)[None, :, None]  # taps never cross a block boundary
        # (base[t, c] + delta[b, i, t, c // g]) * z[b, i - t, c], with channels viewed [G, g]
        grouped = delta[:, :, t] * shifted.view(bsz, seq, groups, group_size)
        term = weight[t] * shifted + grouped.view(bsz, seq, hidden)
        out = out + keep * term
    out = out.to(z.dtype)
    return out if residual is None else residual + out


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm of `x [..., H]` with `weight [H]` (x's dtype): `w * (x * rsqrt(mean(x^2) + eps))
    .to(x.dtype)`, the mean and root in fp32 (fp64 for fp64 inputs: a ground truth), in the
    module's order of ops and roundings (the tests check it equals the module bit for bit)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def grouped_dynamic_conv_norm_reference(
    z: torch.Tensor,
    base: torch.Tensor,
    proj: torch.Tensor,
    side: int,
    block_len: int,
    group_size: int,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`dflash2.kernels.dynamic_conv.grouped_dynamic_conv_norm`:
    `out = residual + conv(z)` (`grouped_dynamic_conv_reference`), `normed = rms_norm_reference(out)`."""
    out = grouped_dynamic_conv_reference(z, base, proj, side, block_len, group_size, residual)
    return out, rms_norm_reference(out, norm_weight, eps)
