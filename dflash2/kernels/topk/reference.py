"""Vocabulary top-k of head logits (spec 5.2): obviously-right PyTorch.

values = softcap(multiplier * logit) in fp32 (softcap s > 0: s * tanh(x / s)); the k largest,
sorted descending, ties broken by the lowest vocabulary index. ``torch.topk`` does not promise
an order among ties, so the definition is a stable descending sort (`vocab_topk_by_sort`: equal
values keep index order). The reference used at run time gets the same answer without sorting
the whole vocabulary: `torch.topk` finds the k-th largest value t; every entry > t is in, and
the entries == t fill the remaining places in index order; a stable sort of those k orders them.
"""

from __future__ import annotations

import torch


def head_transform(logits: torch.Tensor, multiplier: float = 1.0, softcap: float = 0.0) -> torch.Tensor:
    """fp32 ``softcap(multiplier * logits)`` (softcap off when 0), as spec 2.7 (fp64 stays fp64)."""
    values = logits.to(torch.promote_types(logits.dtype, torch.float32)) * multiplier
    if softcap > 0:
        values = softcap * torch.tanh(values / softcap)
    return values


def vocab_topk_by_sort(
    logits: torch.Tensor, k: int, multiplier: float = 1.0, softcap: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition: a stable descending sort of the whole row (slow: O(V log V) per row)."""
    values = head_transform(logits, multiplier, softcap)
    sorted_values, order = torch.sort(values, dim=-1, descending=True, stable=True)
    return sorted_values[:, :k].float().contiguous(), order[:, :k].contiguous()


def vocab_topk_reference(
    logits: torch.Tensor, k: int, multiplier: float = 1.0, softcap: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`dflash2.kernels.topk.vocab_topk`: ``([M, k] fp32, [M, k] int64)``.

    Equal to `vocab_topk_by_sort` (tested), at `torch.topk` cost.
    """
    values = head_transform(logits, multiplier, softcap)
    if torch.isnan(values).any():  # NaN breaks the threshold test; the sort defines that case
        return vocab_topk_by_sort(logits, k, multiplier, softcap)
    kth = torch.topk(values, k, dim=-1).values[:, -1:]                      # [M, 1]
    greater = values > kth
    tied = values == kth
    room = k - greater.sum(-1, keepdim=True)                                # ties still to take
    chosen = greater | (tied & (tied.cumsum(-1) <= room))                   # exactly k per row
    ids = chosen.nonzero()[:, 1].view(values.shape[0], k)                   # ascending index
    picked = values.gather(-1, ids)
    picked, order = torch.sort(picked, dim=-1, descending=True, stable=True)
    return picked.float().contiguous(), ids.gather(-1, order).contiguous()
