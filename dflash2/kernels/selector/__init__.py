"""Candidate selector: transition scores (differentiable) and the fused walk (spec 5.3-5.4)."""

from __future__ import annotations

import torch

from dflash2.kernels.keyed_random import DRAFT_STREAM
from dflash2.kernels.selector.reference import selector_walk_reference, transition_scores

try:
    from dflash2.kernels.selector import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["transition_scores", "selector_walk", "selector_walk_reference"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _selector_walk_triton(unary, cand_ids, eta, pred_codebook, succ_codebook, anchor, temperature, seeds, positions):
    bsz, n_slots, k = unary.shape
    rank = eta.shape[-1]
    unary, cand_ids = unary.contiguous(), cand_ids.contiguous()
    eta = eta if eta.stride(-1) == 1 else eta.contiguous()  # read by its row strides (a fused output's slice)
    pred_codebook, succ_codebook = pred_codebook.contiguous(), succ_codebook.contiguous()
    dev = unary.device
    tokens = torch.empty(bsz, n_slots, dtype=torch.int64, device=dev)
    chosen = torch.empty(bsz, n_slots, dtype=torch.int64, device=dev)
    q = torch.empty(bsz, n_slots, k, dtype=torch.float32, device=dev)
    if bsz == 0 or n_slots == 0:
        return tokens, chosen, q
    kp = max(_next_pow2(k), 16)  # tl.dot needs >= 16 rows and columns
    edges = torch.empty(bsz, n_slots, kp, kp, dtype=torch.float32, device=dev)  # [B, N, pred, cand]
    _tk._selector_edges_kernel[(n_slots, bsz)](
        unary, cand_ids, eta, pred_codebook, succ_codebook, anchor.contiguous(), edges,
        n_slots, k, rank,
        unary.stride(0), unary.stride(1), cand_ids.stride(0), cand_ids.stride(1),
        eta.stride(0), eta.stride(1), pred_codebook.stride(0), succ_codebook.stride(0),
        KP=kp, RB=max(_next_pow2(rank), 16), num_warps=4,
    )
    _tk._selector_walk_kernel[(bsz,)](
        edges, cand_ids, temperature.float().contiguous(), seeds.contiguous(), positions.contiguous(),
        tokens, chosen, q,
        n_slots, k,
        cand_ids.stride(0), cand_ids.stride(1), tokens.stride(0), chosen.stride(0), q.stride(0), q.stride(1),
        STREAM=DRAFT_STREAM, KP=kp, NP=max(_next_pow2(n_slots), 2), num_warps=1,
    )
    return tokens, chosen, q


def selector_walk(
    unary: torch.Tensor,
    cand_ids: torch.Tensor,
    eta: torch.Tensor,
    pred_codebook: torch.Tensor,
    succ_codebook: torch.Tensor,
    anchor: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk the candidate lattice from the anchor, one pick per slot.

    Args:
        unary: ``[B, N, k]`` fp32 unary scores (top-k values of the draft head).
        cand_ids: ``[B, N, k]`` int64 candidate token ids.
        eta: ``[B, N, R]`` context gates ``W_h h_j``.
        pred_codebook: ``[V, R]`` predecessor codebook ``A``.
        succ_codebook: ``[V, R]`` successor codebook ``Z``.
        anchor: ``[B]`` int64 anchor token (predecessor of slot 1).
        temperature: ``[B]`` fp32; 0 = greedy for that row.
        seeds: ``[B]`` int64 sampling seeds.
        positions: ``[B]`` int64 absolute position of the token slot 1 predicts (slot ``j``
            predicts ``positions + j - 1``); the DRAFT-stream key is (seed, that position,
            candidate token id).
        impl: ``"torch"`` or ``"triton"``, already resolved. The Triton path is two launches:
            the k x k edge scores of every slot (one program per slot and request, off the
            walk's serial chain), then the walk (one single-warp program per request, all its
            edges in registers).

    Returns:
        ``(tokens [B, N] int64, chosen [B, N] int64, q [B, N, k] fp32)``: the proposed tokens,
        their candidate indices, and ``softmax(row / T)`` of each realized row (one-hot of
        ``chosen`` when T = 0).
    """
    if unary.dim() != 3 or cand_ids.shape != unary.shape:
        raise ValueError(f"unary and cand_ids must both be [B, N, k], "
                         f"got {tuple(unary.shape)}, {tuple(cand_ids.shape)}")
    if eta.shape[:2] != unary.shape[:2]:
        raise ValueError(f"eta must be [B, N, R], got {tuple(eta.shape)}")
    if impl == "torch":
        return selector_walk_reference(
            unary, cand_ids, eta, pred_codebook, succ_codebook, anchor, temperature, seeds, positions
        )
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _selector_walk_triton(
            unary, cand_ids, eta, pred_codebook, succ_codebook, anchor, temperature, seeds, positions
        )
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")
