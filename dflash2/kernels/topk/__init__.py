"""Vocabulary top-k of the (multiplied, soft-capped) head logits (spec 5.2)."""

from __future__ import annotations

import torch

from dflash2.kernels.topk.reference import head_transform, invalid_rows_reference, vocab_topk_reference

try:
    from dflash2.kernels.topk import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["vocab_topk", "vocab_topk_reference", "invalid_rows_reference", "head_transform", "topk_config"]

_GROUP = 16  # entries per group in stage 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def topk_config(rows: int, vocab: int) -> dict[str, int]:
    """Tiling: stage-1 groups per chunk (of 16 entries) and warps, stage-2 warps.

    Chosen by the tiling sweep of `python -m benchmarks.kernels --sweep` (bitonic `tl.topk`
    selection; `docs/PERFORMANCE.md`, "Kernels"): up to 64 rows, 4096-entry chunks with 4 warps
    (more programs, shorter per-program latency); more rows, 8192-entry chunks with 2 warps
    (fewer programs and partials to merge).
    """
    if rows <= 64:
        return {"groups": 256, "num_warps": 4, "merge_warps": 4}
    return {"groups": 512, "num_warps": 2, "merge_warps": 4}


def _vocab_topk_triton(
    logits: torch.Tensor, k: int, multiplier: float, softcap: float, config: dict[str, int] | None = None,
    with_invalid: bool = False,
) -> tuple[torch.Tensor, ...]:
    """`vocab_topk` in two launches; ``with_invalid`` adds the row flags to the same two."""
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
    invalid = torch.empty(rows, dtype=torch.bool, device=logits.device) if with_invalid else None
    if rows == 0:
        return (values, ids, invalid) if with_invalid else (values, ids)
    part = torch.empty(rows, n_chunks, kp, dtype=torch.int64, device=logits.device)
    # per-(row, chunk) validity state (triton_kernels.py): 0 all -inf, 1 some > -inf, 2 NaN / +inf
    state = torch.empty(rows, n_chunks, dtype=torch.int8, device=logits.device) if with_invalid else None
    npart = max(_next_pow2(n_chunks * kp), 2)
    _tk._topk_chunk_kernel[(rows, n_chunks)](
        logits, part, state, vocab, logits.stride(0), n_chunks, float(multiplier), float(softcap) or 1.0,
        KP=kp, NG=groups, S=_GROUP, SOFTCAP=softcap > 0, INVALID=with_invalid, num_warps=cfg["num_warps"],
    )
    _tk._topk_merge_kernel[(rows,)](
        part, values, ids, state, invalid, n_chunks * kp, n_chunks, values.stride(0), ids.stride(0),
        K=k, KP=kp, NPART=npart, NCH=max(_next_pow2(n_chunks), 2), INVALID=with_invalid,
        num_warps=cfg.get("merge_warps", 4),
    )
    return (values, ids, invalid) if with_invalid else (values, ids)


def vocab_topk(
    logits: torch.Tensor,
    k: int,
    multiplier: float = 1.0,
    softcap: float = 0.0,
    impl: str = "torch",
    *,
    with_invalid: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k over the vocabulary of ``softcap(multiplier * logits)``.

    Args:
        logits: ``[M, V]`` head logits, any float dtype.
        k: number of candidates, ``1 <= k <= V``.
        multiplier: ``output_multiplier`` applied before the softcap.
        softcap: ``final_logit_softcapping`` ``s``; ``s * tanh(x / s)`` when ``s > 0``, off at 0.
        impl: ``"torch"`` (stable-sort reference) or ``"triton"`` (two launches: per-chunk
            partial top-k, then a per-row merge), already resolved by ``resolve_impl``.
        with_invalid: also return the rows' validity flags, computed by the same launches
            (Triton: from the chunk kernel's one read of the logits; no extra launch).

    Returns:
        ``(values [M, k] fp32, ids [M, k] int64)`` sorted descending, ties by lowest index; with
        ``with_invalid``, ``(values, ids, invalid)`` where ``invalid [M]`` bool is True iff raw
        row m of ``logits`` (before multiplier and softcap) holds a NaN, or a +inf, or no entry
        > -inf (all -inf), i.e. ``~isfinite(logits.amax(-1))``, `invalid_rows_reference`; the
        same rows as ``dflash2.engine.sampling.invalid_rows`` applied to each row alone. Both
        impls give identical flags, with no host sync (CUDA-graph safe); values and ids are bit
        for bit those of the call without the flag (on invalid rows they carry no meaning).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [M, V], got {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"k={k} must be in [1, V={logits.shape[1]}]")
    if impl == "torch":
        values, ids = vocab_topk_reference(logits, k, multiplier, softcap)
        return (values, ids, invalid_rows_reference(logits)) if with_invalid else (values, ids)
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _vocab_topk_triton(logits, k, multiplier, softcap, with_invalid=with_invalid)
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")
