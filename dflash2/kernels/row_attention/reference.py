"""Reference of the engine's per-row masked attention over its static cache (torch SDPA).

Query `i` of row `b` sits at absolute position `pos[b, i]`; key slot `j` holds position `j`.
Slot `j` is visible iff `j <= pos[b, i]` and, with a sliding window `W`, `j > pos[b, i] - W`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def visible_mask(positions: torch.Tensor, b: int, q: int, kv: int, window: int | None) -> torch.Tensor:
    """`[B, q, kv]` bool visibility for `positions [B or 1, q]`."""
    pos = positions.expand(b, q)[:, :, None]
    slots = torch.arange(kv, device=positions.device)[None, None, :]
    visible = slots <= pos
    if window:
        visible = visible & (slots > pos - window)
    return visible


def row_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor,
                            window: int | None = None, scale: float | None = None,
                            visible: torch.Tensor | None = None) -> torch.Tensor:
    """Masked GQA attention.

    Args:
        query: `[B, nh, q, hd]`; key, value: `[B, nkv, kv, hd]` (nh a multiple of nkv).
        positions: `[B or 1, q]` absolute positions of the queries.
        window: sliding window (None or 0 = none).
        scale: softmax scale (default `hd ** -0.5`).
        visible: a precomputed `visible_mask` (the engine builds it once per forward).
    Returns:
        `[B, q, nh, hd]` (contiguous), like transformers' attention functions.
    """
    b, nh, q, _ = query.shape
    if visible is None:
        visible = visible_mask(positions.to(query.device), b, q, key.shape[2], window)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=visible[:, None], scale=scale,
                                         enable_gqa=nh != key.shape[1])
    return out.transpose(1, 2).contiguous()
