"""`silu(gate) * up` in one launch: the SwiGLU product between an MLP's fused gate/up projection
and its down projection (the DFlash2 draft's MLP, `dflash2.modeling.draft`).

Guarantees of the Triton path (`triton_kernels.py`):
- **The reference's arithmetic.** fp32 on the widened operands with eager PyTorch's two
  roundings (the SiLU to the dtype, then the product), so outputs equal `F.silu(gate) * up` up to
  the last bit of the fp32 `exp` (tested against the reference).
- **Any row stride.** `gate` and `up` may be column slices of one `[rows, 2I]` tensor (the fused
  gate/up launch's output): each is read with its own row stride; unit stride along the columns.
- **CUDA graphs.** No host sync; the output comes from PyTorch's caching allocator.

Not autograd-aware: the Triton path refuses inputs that require grad while grad is enabled.
"""

from __future__ import annotations

import torch

from dflash2.kernels.silu_mul.reference import silu_mul_reference

try:
    from dflash2.kernels.silu_mul import triton_kernels as _tk
    from dflash2.kernels.rounding import ROUNDING_KIND as _KIND
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["silu_mul", "silu_mul_reference"]

_BLOCK = 1024  # columns per program: 12 programs a row at the 8B shape's I = 12288


def silu_mul(gate: torch.Tensor, up: torch.Tensor, impl: str) -> torch.Tensor:
    """`F.silu(gate) * up` for `gate, up [..., I]` of one shape and dtype (bf16, fp16, fp32).

    Args:
        gate, up: the gate and up projections; with `"triton"`, unit stride along the last dim
            and leading dims that flatten to rows with one stride (views of a fused output do).
        impl: `"torch"` (the reference) or `"triton"` (one launch), already resolved
            (`dflash2.kernels.dispatch.resolve_impl`).
    Returns:
        A new contiguous `[..., I]` tensor of `gate`'s dtype.
    """
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} must match")
    if impl == "torch":
        return silu_mul_reference(gate, up)
    if impl != "triton":
        raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
    if _tk is None:
        raise RuntimeError("impl='triton' needs the 'triton' package; use impl='torch'")
    if gate.dtype not in _KIND:
        raise ValueError(f"silu_mul takes {tuple(_KIND)}, got {gate.dtype}")
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        raise ValueError("silu_mul(impl='triton') is inference-only (no autograd); use impl='torch'")
    cols = gate.shape[-1]
    g2, u2 = (t.reshape(-1, cols) if cols else t for t in (gate, up))
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    rows = out.numel() // cols if cols else 0
    if rows == 0:
        return out
    if g2.stride(-1) != 1 or u2.stride(-1) != 1:
        raise ValueError("silu_mul(impl='triton') needs unit stride along the last dim")
    _tk._silu_mul_kernel[(rows, -(-cols // _BLOCK))](
        g2, u2, out, cols, g2.stride(0), u2.stride(0), cols, BLOCK=_BLOCK, KIND=_KIND[gate.dtype], num_warps=4)
    return out
