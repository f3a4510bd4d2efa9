"""Vocabulary top-k of head logits (spec 5.2): obviously-right PyTorch.

values = softcap(multiplier * logit) in fp32 (softcap s > 0: s * tanh(x / s)); the k largest,
sorted descending, ties broken by the lowest vocabulary index. ``torch.topk`` does not promise
an order among ties, so the definition is a stable descending sort (`vocab_topk_by_sort`: equal
values keep index order). The reference used at run time gets the same answer without sorting
the whole vocabulary: `torch.topk` finds the k-th largest value t; every entry > t is in, and
the entries == t fill the remaining places in index order; a stable sort of those k orders them.

invalid[m] = True iff raw row m holds a NaN or a +inf, or no entry > -inf (all -inf): the rows
with no defined argmax / softmax (`dflash2.engine.sampling.invalid_rows`, one row at a time).
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

    Equal to `vocab_topk_by_sort` (tested), at `torch.topk` cost, with no host sync or
    data-dependent shape, so it can be captured in a CUDA graph. NaN ranks as +inf (the sort
    ranks it above +inf; rows with NaN logits are rejected by the engine either way).
    """
    values = head_transform(logits, multiplier, softcap)
    rank = torch.where(torch.isnan(values), float("inf"), values)
    kth = torch.topk(rank, k, dim=-1).values[:, -1:]                          # [M, 1]
    greater = rank > kth
    tied = rank == kth
    room = k - greater.sum(-1, keepdim=True)                                  # ties still to take
    chosen = greater | (tied & (tied.cumsum(-1) <= room))                     # exactly k per row
    vocab = values.shape[-1]
    # Chosen entries in ascending index order: the largest keys are the lowest chosen indices.
    key = torch.where(chosen, vocab - torch.arange(vocab, device=values.device), 0)
    ids = torch.topk(key, k, dim=-1).indices
    order = torch.sort(rank.gather(-1, ids), dim=-1, descending=True, stable=True).indices
    ids = ids.gather(-1, order)
    return values.gather(-1, ids).float().contiguous(), ids.contiguous()


def invalid_rows_reference(logits: torch.Tensor) -> torch.Tensor:
    """``[M]`` bool of raw ``logits [M, V]``: True iff the row holds a NaN or a +inf, or has no
    entry > -inf (every entry -inf). Judged before any multiplier / softcap.

    One reduction: the row max is NaN if any entry is NaN (``amax`` propagates NaN), +inf if any
    entry is +inf, -inf iff every entry is -inf, and finite otherwise.
    """
    return ~torch.isfinite(logits.amax(-1))
