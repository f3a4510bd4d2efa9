"""The fused head loss's row work in one launch: for the draft's logits `z [N, V]`, the CE's
logsumexp, its gradient with respect to the logits and the maxima of column groups, which the
selector's top-k (`dflash2.training.losses.grouped_topk`) narrows its search to.

`head_ce(z, y, coef, group=..., impl=...)` returns `(lse [N] fp32, grad [N, V] z.dtype,
gmax [N, V // group] z.dtype)`; `reference.py` states the math.

Guarantees of the Triton path (`triton_kernels.py`):
- **Reads the logits twice, writes the gradient once.** The torch path reads `[N, V]` three times
  (the group maxima, the logsumexp, the gradient); at the 0.5B ablation's chunk (7680 x 151936
  bf16, 2.3 GB) each read is a millisecond or more.
- **Group maxima exact**: the same values as the reference's `amax` (a maximum rounds nothing).
- **lse and grad within fp32 rounding** of the reference: the online logsumexp sums in another
  order than `torch.logsumexp`, and `exp` may differ in its last bit; the gradient is rounded
  once, to nearest even, to `z`'s dtype, as the reference's cast (tests/kernels/test_head_ce.py).
- **Deterministic and row-independent**: one program per row, one fixed order, no atomics.
- **CUDA graphs / torch.compile**: no host sync; outputs from the caching allocator; inside a
  compiled region it runs as the opaque operator `dflash2::head_ce`.

Not autograd-aware (the fused head loss computes its gradient itself): inputs needing grad are
refused while grad is enabled.
"""

from __future__ import annotations

import torch

from dflash2.kernels.head_ce.reference import head_ce_reference

try:
    from dflash2.kernels.head_ce import triton_kernels as _tk
    from dflash2.kernels.rounding import ROUNDING_KIND as _KIND
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["head_ce", "head_ce_reference", "TILE_GROUPS", "BLOCK"]

TILE_GROUPS = 8   # groups per pass-1 tile (8 x 128 = 1024 logits)
BLOCK = 1024      # logits per pass-2 tile


def head_ce(z: torch.Tensor, y: torch.Tensor, coef: torch.Tensor, *, group: int, impl: str
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(lse, grad, gmax)` of the logits `z` (module docstring).

    Args:
        z: `[N, V]` bf16, fp16 or fp32 (the triton path: contiguous), `V % group == 0`.
        y: `[N]` int64 labels in `[0, V)`; coef: `[N]` fp32 weights.
        group: columns per group of `gmax` (a power of two for the triton path).
        impl: `"torch"` (the reference) or `"triton"`, already resolved
            (`dflash2.kernels.dispatch.resolve_impl`).
    Raises:
        ValueError: shapes, dtypes or `impl` the path does not take, each naming the fix.
    """
    if z.dim() != 2 or y.shape != z.shape[:1] or coef.shape != z.shape[:1]:
        raise ValueError(f"head_ce takes z [N, V], y [N], coef [N]; got {tuple(z.shape)}, {tuple(y.shape)}, "
                         f"{tuple(coef.shape)}")
    if z.shape[1] % group:
        raise ValueError(f"head_ce: V = {z.shape[1]} is not a multiple of group = {group}; "
                         "use the unfused path (dflash2.training.losses.ce_and_logits_grad)")
    if impl == "torch":
        return head_ce_reference(z, y, coef, group)
    if impl != "triton":
        raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
    if _tk is None:
        raise RuntimeError("impl='triton' needs the 'triton' package; use impl='torch'")
    if z.dtype not in _KIND or coef.dtype != torch.float32 or y.dtype != torch.int64:
        raise ValueError(f"head_ce(impl='triton') takes z in {tuple(_KIND)}, y int64, coef fp32; got {z.dtype}, "
                         f"{y.dtype}, {coef.dtype}")
    if group & (group - 1) or group < 16:
        raise ValueError(f"head_ce(impl='triton') needs a power-of-two group >= 16, got {group}")
    if torch.is_grad_enabled() and (z.requires_grad or coef.requires_grad):
        raise ValueError("head_ce(impl='triton') computes the gradient itself; call it under torch.no_grad()")
    if torch.compiler.is_compiling():
        return _head_ce_op(z, y, coef, group)
    return _launch(z, y, coef, group)


def _launch(z: torch.Tensor, y: torch.Tensor, coef: torch.Tensor, group: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    z, y, coef = z.contiguous(), y.contiguous(), coef.contiguous()
    N, V = z.shape
    lse = torch.empty(N, dtype=torch.float32, device=z.device)
    grad = torch.empty_like(z)
    gmax = torch.empty(N, V // group, dtype=z.dtype, device=z.device)
    if N:
        _tk._head_ce_kernel[(N,)](z, y, coef, lse, grad, gmax, V, V // group, GROUP=group,
                                  TILE_GROUPS=TILE_GROUPS, BLOCK=BLOCK, KIND=_KIND[z.dtype], num_warps=4)
    return lse, grad, gmax


@torch.library.custom_op("dflash2::head_ce", mutates_args=())
def _head_ce_op(z: torch.Tensor, y: torch.Tensor, coef: torch.Tensor, group: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton path as one opaque operator, so a compiled training forward keeps it whole."""
    return _launch(z, y, coef, group)


@_head_ce_op.register_fake
def _head_ce_fake(z, y, coef, group):
    N, V = z.shape
    return (z.new_empty(N, dtype=torch.float32), torch.empty_like(z, memory_format=torch.contiguous_format),
            z.new_empty(N, V // group))
