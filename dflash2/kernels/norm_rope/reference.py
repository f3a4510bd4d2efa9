"""The reference for the norm-RoPE kernel: the draft attention's own ops, in their order.

For `x [B, S, H, hd]` (a projection's output viewed per head), the per-head RMSNorm of
`Qwen3RMSNorm` (`w * (x * rsqrt(mean(x^2) + eps)).to(dtype)`, the mean in fp32, in fp64 for
fp64 inputs, so that fp64 operands give the tests a ground truth), moved to
`[B, H, S, hd]`, then RoPE `y * cos + rotate_half(y) * sin` in `x`'s dtype: what
`DraftAttention` computes for its queries and keys with `q_norm` / `k_norm` and `_rope`. This is
the CPU path and the autograd path; `tests/kernels/test_norm_rope.py` checks it against the
modules bit for bit.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """`[-x2, x1]` for the halves `x1, x2` of the last dimension (the RoPE pairing of Llama / Qwen)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def norm_rope_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                        sin: torch.Tensor) -> torch.Tensor:
    """`x [B, S, H, hd]`, `weight [hd]`, `cos, sin [B, S, hd]` -> `[B, H, S, hd]` in `x`'s dtype."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = (weight * normed).transpose(1, 2)
    return y * cos[:, None] + rotate_half(y) * sin[:, None]


def scatter_reference(cache: torch.Tensor, y: torch.Tensor, slots: torch.Tensor) -> None:
    """Write `y [B, H, S, hd]` into `cache [B, H, L, hd]` at `slots [B, S]` (per row), cast to the
    cache's dtype: `DraftContextCache.write`'s scatter."""
    idx = slots[:, None, :, None].expand(-1, y.shape[1], -1, y.shape[3])
    cache.scatter_(2, idx, y.to(cache.dtype))
