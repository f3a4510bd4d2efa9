"""Vocabulary top-k of head logits (spec 5.2): obviously-right PyTorch.

values = softcap(multiplier * logit) in fp32 (softcap s > 0: s * tanh(x / s)); the k largest,
sorted descending, ties broken by the lowest vocabulary index. ``torch.topk`` does not promise
an order among ties, so this uses a stable descending sort: equal values keep index order.
"""

from __future__ import annotations

import torch


def head_transform(logits: torch.Tensor, multiplier: float = 1.0, softcap: float = 0.0) -> torch.Tensor:
    """fp32 ``softcap(multiplier * logits)`` (softcap off when 0), as spec 2.7 (fp64 stays fp64)."""
    values = logits.to(torch.promote_types(logits.dtype, torch.float32)) * multiplier
    if softcap > 0:
        values = softcap * torch.tanh(values / softcap)
    return values


def vocab_topk_reference(
    logits: torch.Tensor, k: int, multiplier: float = 1.0, softcap: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`dflash2.kernels.topk.vocab_topk`: ``([M, k] fp32, [M, k] int64)``."""
    values = head_transform(logits, multiplier, softcap)
    sorted_values, order = torch.sort(values, dim=-1, descending=True, stable=True)
    return sorted_values[:, :k].float().contiguous(), order[:, :k].contiguous()
