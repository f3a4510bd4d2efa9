"""Vocabulary top-k of the (multiplied, soft-capped) head logits (spec 5.2)."""

from __future__ import annotations

import torch

from dflash2.kernels.topk.reference import head_transform, vocab_topk_reference

try:
    from dflash2.kernels.topk import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["vocab_topk", "vocab_topk_reference", "head_transform", "topk_config"]

_GROUP = 16  # entries per group in stage 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def topk_config(rows: int, vocab: int) -> dict[str, int]:
    """Tiling: stage-1 groups per chunk (of 16 entries) and warps, stage-2 warps.

    From H200 sweeps (bitonic tl.topk selection, CUDA-graph medians): few rows want 4096-entry
    chunks with 4 warps (more programs, shorter per-program latency), many rows 8192-entry
    chunks with 2 warps (fewer programs and partials to merge).
    """
    if rows <= 64:
        return {"groups": 256, "num_warps": 4, "merge_warps": 4}
    return {"groups": 512, "num_warps": 2, "merge_warps": 4}


def _vocab_topk_triton(
    logits: torch.Tensor, k: int, multiplier: float, softcap: float, config: dict[str, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    cfg = config or topk_config(rows, vocab)
    groups = cfg["groups"]
    kp = max(_next_pow2(k), 2)
    if kp > groups:
        groups = kp  # need at least kp groups per chunk
    chunk = groups * _GROUP
    n_chunks = (vocab + chunk - 1) // chunk
    values = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return values, ids
    part = torch.empty(rows, n_chunks, kp, dtype=torch.int64, device=logits.device)
    npart = max(_next_pow2(n_chunks * kp), 2)
    _tk._topk_chunk_kernel[(rows, n_chunks)](
        logits, part, vocab, logits.stride(0), n_chunks, float(multiplier), float(softcap) or 1.0,
        KP=kp, NG=groups, S=_GROUP, SOFTCAP=softcap > 0, num_warps=cfg["num_warps"],
    )
    _tk._topk_merge_kernel[(rows,)](
        part, values, ids, n_chunks * kp, values.stride(0), ids.stride(0),
        K=k, KP=kp, NPART=npart, num_warps=cfg.get("merge_warps", 4),
    )
    return values, ids


def vocab_topk(
    logits: torch.Tensor,
    k: int,
    multiplier: float = 1.0,
    softcap: float = 0.0,
    impl: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k over the vocabulary of ``softcap(multiplier * logits)``.

    Args:
        logits: ``[M, V]`` head logits, any float dtype.
        k: number of candidates, ``1 <= k <= V``.
        multiplier: ``output_multiplier`` applied before the softcap.
        softcap: ``final_logit_softcapping`` ``s``; ``s * tanh(x / s)`` when ``s > 0``, off at 0.
        impl: ``"torch"`` (stable-sort reference) or ``"triton"`` (two launches: per-chunk
            partial top-k, then a per-row merge), already resolved by ``resolve_impl``.

    Returns:
        ``(values [M, k] fp32, ids [M, k] int64)`` sorted descending, ties by lowest index.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [M, V], got {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k={k} must be in [1, V={logits.shape[1]}]")
    if impl == "torch":
        return vocab_topk_reference(logits, k, multiplier, softcap)
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _vocab_topk_triton(logits, k, multiplier, softcap)
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")
