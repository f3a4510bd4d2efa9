"""Candidate selector edges and walk (spec 5.3-5.4): obviously-right PyTorch.

Edge score of predecessor token ``p`` and candidate ``c`` at slot ``j``:

    S_j(p, c) = U_j[c] + sum_r A[p, r] * eta_j[r] * Z[C_j[c], r]        (fp32)

The walk starts from the anchor and, slot by slot, scores the k candidates from the previous
pick: greedy argmax (ties -> lowest index) at T = 0, else Gumbel-max over row / T with noise
keyed (seed, position, candidate token id) on the DRAFT stream, which samples exactly from
q_j = softmax(row / T). Returns the realized q rows (one-hot at T = 0).
"""

from __future__ import annotations

import torch

from dflash2.kernels.keyed_random import DRAFT_STREAM, keyed_uniform


def transition_scores(
    pred_ids: torch.Tensor,
    eta: torch.Tensor,
    cand_ids: torch.Tensor,
    pred_codebook: torch.Tensor,
    succ_codebook: torch.Tensor,
) -> torch.Tensor:
    """Bilinear transition term ``sum_r A[pred, r] * eta[r] * Z[cand, r]`` in fp32 (differentiable).

    Args:
        pred_ids: ``[...]`` predecessor token ids.
        eta: ``[..., R]`` context gate ``W_h h``.
        cand_ids: ``[..., k]`` candidate token ids.
        pred_codebook: ``[V, R]`` ``A``.
        succ_codebook: ``[V, R]`` ``Z``.

    Returns:
        ``[..., k]`` fp32 scores.
    """
    gated = pred_codebook[pred_ids].float() * eta.float()  # [..., R]
    succ = succ_codebook[cand_ids].float()  # [..., k, R]
    return (succ * gated.unsqueeze(-2)).sum(-1)


def selector_walk_reference(
    unary: torch.Tensor,
    cand_ids: torch.Tensor,
    eta: torch.Tensor,
    pred_codebook: torch.Tensor,
    succ_codebook: torch.Tensor,
    anchor: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference of :func:`dflash2.kernels.selector.selector_walk` (no host syncs)."""
    bsz, n_slots, k = unary.shape
    sampled = temperature > 0  # [B]
    temp = torch.where(sampled, temperature.float(), torch.ones_like(temperature, dtype=torch.float32))
    prev = anchor.long()
    tokens, chosen, qs = [], [], []
    for j in range(n_slots):
        cand = cand_ids[:, j].long()  # [B, k]
        row = unary[:, j].float() + transition_scores(prev, eta[:, j], cand, pred_codebook, succ_codebook)
        scaled = row / temp[:, None]
        u = keyed_uniform(seeds[:, None].long(), DRAFT_STREAM, (positions.long() + j)[:, None], cand)
        gumbel = -torch.log(-torch.log(u))
        score = torch.where(sampled[:, None], scaled + gumbel, row)
        pick = score.argmax(dim=-1)  # first maximum: ties -> lowest index
        one_hot = (torch.arange(k, device=unary.device) == pick[:, None]).float()
        q = torch.where(sampled[:, None], torch.softmax(scaled, dim=-1), one_hot)
        prev = cand.gather(1, pick[:, None]).squeeze(1)
        tokens.append(prev)
        chosen.append(pick)
        qs.append(q)
    if n_slots == 0:
        empty = torch.zeros(bsz, 0, dtype=torch.int64, device=unary.device)
        return empty, empty.clone(), torch.zeros(bsz, 0, k, dtype=torch.float32, device=unary.device)
    return torch.stack(tokens, 1), torch.stack(chosen, 1), torch.stack(qs, 1)
