"""Block verification: greedy prefix match and sparse-q speculative sampling (spec section 8)."""

from __future__ import annotations

import torch

from dflash2.kernels.keyed_random import ACCEPT_STREAM, TARGET_STREAM
from dflash2.kernels.verify.reference import bad_rows, verify_block_reference

try:
    from dflash2.kernels.verify import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["verify_block", "verify_block_reference", "bad_rows"]

_BLOCK = 8192  # vocab entries per stage-1 program, 8 warps (the tiling sweep's pick: benchmarks.kernels --sweep)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _verify_block_triton(
    logits, draft_tokens, cand_ids, q, temperature, seeds, positions, block: int = _BLOCK, num_warps: int = 8
):
    bsz, n_rows, vocab = logits.shape
    n_draft = n_rows - 1
    k = cand_ids.shape[-1]
    dev = logits.device
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    draft_tokens, cand_ids, q = draft_tokens.contiguous(), cand_ids.contiguous(), q.float().contiguous()
    temperature, seeds, positions = temperature.float().contiguous(), seeds.contiguous(), positions.contiguous()
    accepted = torch.empty(bsz, dtype=torch.int64, device=dev)
    next_token = torch.empty(bsz, dtype=torch.int64, device=dev)
    if bsz == 0:
        return accepted, next_token
    n_chunks = (vocab + block - 1) // block
    shape = (bsz * n_rows, n_chunks)
    mx = torch.empty(shape, dtype=torch.float32, device=dev)
    se = torch.empty(shape, dtype=torch.float32, device=dev)
    rk = torch.empty(shape, dtype=torch.float32, device=dev)
    am = torch.empty(shape, dtype=torch.int32, device=dev)
    ri = torch.empty(shape, dtype=torch.int32, device=dev)
    nan = torch.empty(shape, dtype=torch.int32, device=dev)
    kp = max(_next_pow2(k), 2)
    s_cb = cand_ids.stride(0) if n_draft > 0 else 0
    s_cj = cand_ids.stride(1) if n_draft > 0 else 0
    s_qb = q.stride(0) if n_draft > 0 else 0
    s_qj = q.stride(1) if n_draft > 0 else 0
    s_db = draft_tokens.stride(0) if n_draft > 0 else 0
    _tk._verify_stats_kernel[shape](
        logits, cand_ids, temperature, seeds, positions,
        mx, am, se, rk, ri, nan,
        vocab, n_draft, k, n_chunks,
        logits.stride(0), logits.stride(1), s_cb, s_cj,
        TARGET=TARGET_STREAM, BLOCK=block, KP=kp, FAST_LOG=logits.device.type == "cuda", num_warps=num_warps,
    )
    _tk._verify_combine_kernel[(bsz,)](
        logits, draft_tokens, cand_ids, q, temperature, seeds, positions,
        mx, am, se, rk, ri, nan,
        accepted, next_token,
        vocab, n_draft, k, n_chunks,
        logits.stride(0), logits.stride(1), s_db, s_cb, s_cj, s_qb, s_qj,
        ACCEPT=ACCEPT_STREAM, TARGET=TARGET_STREAM,
        NP1P=max(_next_pow2(n_rows), 2), NCHP=max(_next_pow2(n_chunks), 2), KP=kp, num_warps=4,
    )
    return accepted, next_token


def verify_block(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    cand_ids: torch.Tensor,
    q: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one speculative block per request.

    Args:
        logits: ``[B, N+1, V]`` fp32 target logits, already divided by T with top-k/top-p
            filtered entries at -inf (raw logits for T = 0 rows). Row i scores position
            ``positions + i``.
        draft_tokens: ``[B, N]`` int64 proposed tokens.
        cand_ids: ``[B, N, k]`` int64 candidate ids of each slot (``q``'s support).
        q: ``[B, N, k]`` fp32 proposal probabilities over ``cand_ids`` (ignored at T = 0).
        temperature: ``[B]`` fp32; 0 = greedy prefix match for that row.
        seeds: ``[B]`` int64 sampling seeds.
        positions: ``[B]`` int64 absolute position of the token logits row 0 predicts.
        impl: ``"torch"`` or ``"triton"``, already resolved. The Triton path is two launches:
            a stage over ``[B*(N+1), vocab chunks]`` (max / argmax / sum-exp / race partials,
            reading the logits once) and a one-program-per-request combine (merge, acceptance
            walk, residual race); no torch ops in between.

    Returns:
        ``(accepted [B] int64 in 0..N, next_token [B] int64)``. Error flag: a request with a
        NaN, all -inf or +inf logits row gets ``accepted = 0`` and ``next_token = -1``; the torch
        path raises ``ValueError`` instead (except under CUDA-graph capture), the Triton path
        never syncs, so the caller must check ``next_token < 0``.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, N+1, V], got {tuple(logits.shape)}")
    bsz, n_rows, _ = logits.shape
    if tuple(draft_tokens.shape) != (bsz, n_rows - 1):
        raise ValueError(f"draft_tokens must be [B, N] = {(bsz, n_rows - 1)}, got {tuple(draft_tokens.shape)}")
    if cand_ids.shape[:2] != draft_tokens.shape or q.shape != cand_ids.shape:
        raise ValueError(f"cand_ids and q must be [B, N, k], got {tuple(cand_ids.shape)}, {tuple(q.shape)}")
    if impl == "torch":
        return verify_block_reference(logits, draft_tokens, cand_ids, q, temperature, seeds, positions)
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _verify_block_triton(logits, draft_tokens, cand_ids, q, temperature, seeds, positions)
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")
