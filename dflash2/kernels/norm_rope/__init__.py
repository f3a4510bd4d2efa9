"""Norm-RoPE: the draft attention's per-head RMSNorm and RoPE of its queries and keys in one
launch, written where the attention reads them (a fresh `[B, H, S, hd]` tensor, or the draft's
context cache at each token's slot, with the values beside the keys).

In the cached (inference) forward of `DraftAttention`, the reference ops are about 20 small
kernels per layer: the norms, RoPE's `mul` / `neg` / `cat` / `add` for the queries, the block
keys and the context keys, and four scatters into the cache. Here the block's queries, and the
keys and values of the context and the block (`DraftAttention` projects both in one linear), are
one launch (`norm_rope_queries_and_cache`); `norm_rope` and `norm_rope_into_cache` run either
part alone. What it saves of the draft + select step: `docs/PERFORMANCE.md`, "Draft + select".

Guarantees of the Triton path (`triton_kernels.py`):
- **The reference's roundings.** Every op of the reference that rounds to the model's dtype
  rounds at the same place here (fp32 products of 16-bit values are exact), so the result
  differs from the reference only through the order of the mean's fp32 sum and the rsqrt's last
  bit: in bf16 / fp16 within one unit in the last place, and bit-identical in nearly every
  element (a 16-bit rounding hides a last-bit fp32 difference); in fp32 within a few ulps, with
  the inverse root as a correctly rounded `1 / sqrt` (not the approximate rsqrt).
- **Row-local.** Each token's outputs depend on that token's inputs only (one program per
  token), so a row's result does not change with the batch.
- **CUDA graphs.** No host sync, no device value read on the host; slots are read on the
  device. Writes to a slot past the cache's length are dropped (the caller checks the capacity
  once per forward, `DraftContextCache.check_capacity`), so a bad slot cannot write out of bounds.
- **Inference only.** The Triton path refuses inputs that require grad while grad is enabled.

The shapes it takes (`fits`): `x [B, S, H, hd]` with unit stride along hd, hd even with hd / 2 a
power of two, `weight [hd]` and `cos, sin [B, S, hd]` of `x`'s dtype (bf16, fp16 or fp32).
"""

from __future__ import annotations

import torch

from dflash2.kernels.norm_rope.reference import norm_rope_reference, rotate_half, scatter_reference

try:
    from dflash2.kernels.norm_rope import triton_kernels as _tk
    from dflash2.kernels.rounding import ROUNDING_KIND as _KIND  # the kernel's rounding of each dtype
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["norm_rope", "norm_rope_into_cache", "norm_rope_queries_and_cache", "norm_rope_reference",
           "scatter_reference", "rotate_half", "fits", "DTYPES"]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def fits(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether the Triton path takes `x [B, S, H, hd]` with `weight [hd]` and `cos [B, S, hd]`."""
    if x.dim() != 4 or x.dtype not in DTYPES or weight.dtype != x.dtype or cos.dtype != x.dtype:
        return False
    hd = x.shape[-1]
    half = hd // 2
    return hd % 2 == 0 and half >= 1 and half & (half - 1) == 0 and tuple(weight.shape) == (hd,)


def _check(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    B, S, _, hd = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (B, S, hd):
            raise ValueError(f"{name} {tuple(t.shape)} does not match x {tuple(x.shape)}: expected [B, S, hd]")
    if not fits(x, weight, cos) or sin.dtype != x.dtype:
        raise ValueError(f"the norm-RoPE kernel takes x [B, S, H, hd] ({DTYPES}) with hd / 2 a power of two and "
                         f"weight, cos, sin of x's dtype; got x {tuple(x.shape)} {x.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype}, cos {cos.dtype}, sin {sin.dtype}; use impl='torch'")
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        raise ValueError("the norm-RoPE kernel is inference-only (no autograd); use impl='torch' or torch.no_grad()")


def _check_caches(k: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if tuple(k_cache.shape) != tuple(v_cache.shape) or k_cache.shape[1] != k.shape[2] or k_cache.shape[3] != k.shape[3]:
        raise ValueError(f"caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not take keys {tuple(k.shape)}")


def _token_args(x, weight, eps, cos, sin, out, slots, v, v_out) -> tuple[list, dict, int]:
    """The token kernel's runtime arguments (from `x` through the value output's strides), its
    per-launch constexprs, and its program count (B * S), for `x [B, S, H, hd]` into `out [B, H,
    L, hd]` at `slots [B, S]` (None: position s, L = S); `v`, `v_out` likewise for the values (or None)."""
    B, S, H, hd = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cos.stride() != sin.stride() or cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    weight = weight.contiguous()
    if out.stride(-1) != 1:
        raise ValueError("out must have unit stride along hd")
    has_v = v is not None
    if has_v:
        if tuple(v.shape) != tuple(x.shape) or tuple(v_out.shape[:2]) != tuple(out.shape[:2]):
            raise ValueError(f"values {tuple(v.shape)} -> {tuple(v_out.shape)} do not match keys {tuple(x.shape)} -> "
                             f"{tuple(out.shape)}")
        if v.stride(-1) != 1:
            v = v.contiguous()
        if v_out.stride(-1) != 1:
            raise ValueError("v_out must have unit stride along hd")
    else:
        v, v_out = x, out  # never read or written
    if slots is not None:
        if tuple(slots.shape) != (B, S):
            raise ValueError(f"slots {tuple(slots.shape)} do not match x [B={B}, S={S}]")
        slot_arg, s_pb, s_ps, length = slots, slots.stride(0), slots.stride(1), out.shape[2]
    else:
        slot_arg, s_pb, s_ps, length = x, 0, 0, S
    args = [x, weight, cos, sin, out, slot_arg, v, v_out, S, H, length, float(eps),
            x.stride(0), x.stride(1), x.stride(2), cos.stride(0), cos.stride(1),
            out.stride(0), out.stride(1), out.stride(2), s_pb, s_ps,
            v.stride(0), v.stride(1), v.stride(2), v_out.stride(0), v_out.stride(1), v_out.stride(2)]
    meta = dict(HALF=hd // 2, BLOCK_H=max(1, 1 << max(H - 1, 0).bit_length()), KIND=_KIND[x.dtype],
                HAS_SLOTS=slots is not None, HAS_V=has_v)
    return args, meta, B * S


def _launch(x, weight, eps, cos, sin, out, slots, v, v_out) -> None:
    """One program per token of `x [B, S, H, hd]` (`_token_args` has the arguments)."""
    args, meta, programs = _token_args(x, weight, eps, cos, sin, out, slots, v, v_out)
    if programs:
        _tk._norm_rope_kernel[(programs,)](*args, **meta, num_warps=4)


def _resolved(impl: str) -> None:
    if impl not in ("torch", "triton"):
        raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
    if impl == "triton" and _tk is None:
        raise RuntimeError("impl='triton' needs the triton package; use impl='torch'")


def norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, *,
              impl: str = "torch") -> torch.Tensor:
    """Per-head RMSNorm and RoPE of `x [B, S, H, hd]` (`weight [hd]`, `cos, sin [B, S, hd]`).

    Returns a new `[B, H, S, hd]` tensor of `x`'s dtype (the attention's layout).
    `impl`: `"torch"` (`norm_rope_reference`) or `"triton"` (resolved, `dflash2.kernels.dispatch`).
    Raises ValueError for shapes or dtypes the kernel does not take (`fits`).
    """
    _resolved(impl)
    if impl == "torch":
        return norm_rope_reference(x, weight, eps, cos, sin)
    _check(x, weight, cos, sin)
    B, S, H, hd = x.shape
    out = torch.empty(B, H, S, hd, dtype=x.dtype, device=x.device)
    _launch(x, weight, eps, cos, sin, out, None, None, None)
    return out


def norm_rope_into_cache(k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                         sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, *,
                         impl: str = "torch") -> None:
    """Write `norm_rope(k, ...)` and `v` (both `[B, S, H, hd]`) into `k_cache`, `v_cache`
    (`[B, H, L, hd]`, cast to their dtype) at `slots [B, S]` per row, as
    `DraftContextCache.write` does with the reference's keys. Slots must lie in `0 .. L - 1`
    (the Triton path drops the others; the reference raises)."""
    _resolved(impl)
    if impl == "torch":
        scatter_reference(k_cache, norm_rope_reference(k, weight, eps, cos, sin), slots)
        scatter_reference(v_cache, v.transpose(1, 2), slots)
        return
    _check(k, weight, cos, sin)
    _check_caches(k, k_cache, v_cache)
    _launch(k, weight, eps, cos, sin, k_cache, slots.to(torch.long), v, v_cache)


def norm_rope_queries_and_cache(q: torch.Tensor, q_weight: torch.Tensor, q_eps: float, q_cos: torch.Tensor,
                                q_sin: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_weight: torch.Tensor,
                                k_eps: float, k_cos: torch.Tensor, k_sin: torch.Tensor, k_cache: torch.Tensor,
                                v_cache: torch.Tensor, slots: torch.Tensor, *, impl: str = "torch") -> torch.Tensor:
    """`norm_rope(q, ...)` returned and `norm_rope_into_cache(k, v, ...)` done, as one launch on
    the Triton path (a program per key token, then a program per query token, each running
    exactly what its own launch would: the same bits as the two calls). `q [B, S_q, H_q, hd]`
    and `k, v [B, S_k, H_k, hd]` share B, hd and dtype; the rest as in those two functions.
    Returns the queries `[B, H_q, S_q, hd]`."""
    _resolved(impl)
    if impl == "torch":
        norm_rope_into_cache(k, v, k_weight, k_eps, k_cos, k_sin, k_cache, v_cache, slots, impl="torch")
        return norm_rope_reference(q, q_weight, q_eps, q_cos, q_sin)
    _check(q, q_weight, q_cos, q_sin)
    _check(k, k_weight, k_cos, k_sin)
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.dtype != k.dtype:
        raise ValueError(f"queries {tuple(q.shape)} {q.dtype} and keys {tuple(k.shape)} {k.dtype} must share B, hd "
                         "and dtype")
    _check_caches(k, k_cache, v_cache)
    B, S_q, H_q, hd = q.shape
    out = torch.empty(B, H_q, S_q, hd, dtype=q.dtype, device=q.device)
    k_args, k_meta, n_k = _token_args(k, k_weight, k_eps, k_cos, k_sin, k_cache, slots.to(torch.long), v, v_cache)
    q_args, q_meta, n_q = _token_args(q, q_weight, q_eps, q_cos, q_sin, out, None, None, None)
    if n_k + n_q:
        _tk._norm_rope_pair_kernel[(n_k + n_q,)](n_k, *k_args, *q_args, HALF=k_meta["HALF"], BLOCK_HK=k_meta["BLOCK_H"],
                                                 BLOCK_HQ=q_meta["BLOCK_H"], KIND=k_meta["KIND"], num_warps=4)
    return out
