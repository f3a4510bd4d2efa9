"""Row mean: `x.mean(-1)` with a summation order that depends on nothing but the row.

Exact mode needs each row of the target's forward to come out the same bits whatever the number
of rows. The stock RMSNorms of transformers (`LlamaRMSNorm`, `Qwen2RMSNorm`, `Qwen3RMSNorm`)
compute `x.float().pow(2).mean(-1, keepdim=True)`, and PyTorch's CUDA reduction picks its
strategy, and with it the order of the sum, from the tensor's shape. `row_mean` is that mean
with one order per row; `RowMeanMode` routes the stock modules' `mean` calls through it without
touching modeling code (a `torch.overrides.TorchFunctionMode`, as `SmallMLinearMode` does for
`F.linear`).

Guarantees of the Triton path (`triton_kernels.py`):
- **Row invariance.** One program per row; the row is read in chunks of `block_k_for(K, dtype)`
  elements, summed lane by lane into an fp32 vector in chunk order, then reduced by one `tl.sum`
  whose tree is fixed by that block size and its `num_warps`. Nothing is chosen from the number
  of rows and no row reads another, so row i's bits are the same alone or among any others.
- **Deterministic.** No atomics: the same inputs give the same bits on every call.
- **Accuracy.** fp32 accumulation of the (exactly widened) inputs, division by K in fp32, one
  rounding to `x`'s dtype; the error is within the order-free fp32 bound of the sum and the
  division, `(K + 1) * 2^-24 * mean(|x|)` (first order), plus that final rounding.
- **Layout-independent.** The kernel takes contiguous rows that start 16-byte aligned (the
  compiler derives its load width, and with it `tl.sum`'s tree, from alignment), so any other
  input is copied to such rows first: a view, a transpose, an offset slice give the bits of the
  same rows laid out contiguously.
- **CUDA graphs.** No host sync and no device value read on the host: the grid and block size
  depend on shapes only (the alignment check reads the pointer, a host value). It allocates its
  output and, for inputs that are not contiguous rows starting 16-byte aligned, that copy, both
  through PyTorch's caching allocator (a fresh tensor, as the RMSNorms' `pow(2)`, needs none).
  The first call per (K, dtype) compiles the kernel: make it before capture, as for every
  Triton kernel.

Not autograd-aware: the Triton path refuses inputs that require grad while grad is enabled.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from dflash2.kernels.row_mean.reference import row_mean_reference

try:
    from dflash2.kernels.row_mean import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["row_mean", "row_mean_reference", "block_k_for", "RowMeanMode", "DTYPES"]

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_CHUNK_BYTES = 4096  # one chunk of a row: 1024 fp32 or 2048 16-bit elements
_MEAN_KWARGS = frozenset({"input", "dim", "keepdim", "dtype"})


def block_k_for(k: int, dtype: torch.dtype) -> int:
    """Elements per chunk of a row of `k` elements of `dtype`: 4 KiB of input (1024 fp32, 2048
    bf16 / fp16), or the next power of two >= `k` (at least 16) when the row is shorter.
    A pure function of `(k, dtype)`, never of the number of rows."""
    cap = _CHUNK_BYTES // dtype.itemsize
    return min(cap, max(16, 1 << max(k - 1, 0).bit_length()))


def _num_warps(block_k: int) -> int:
    """Warps per program for a chunk of `block_k` elements: 8 elements a thread (16-byte loads of
    16-bit data), 1 to 8 warps. Fixed by `block_k`, so it fixes `tl.sum`'s tree too."""
    return min(8, max(1, block_k // 256))


def _row_mean_triton(x: torch.Tensor, block_k: int, num_warps: int) -> torch.Tensor:
    """The Triton path on `x [R, K]` (K >= 1, any strides); returns a new `[R]` tensor of
    `x.dtype`. No launch for R = 0."""
    rows, k = x.shape
    out = torch.empty(rows, dtype=x.dtype, device=x.device)
    if rows:
        _tk._row_mean_kernel[(rows,)](_aligned_rows(x), out, k, BLOCK_K=block_k, num_warps=num_warps)
    return out


def _aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """`x [R, K]` itself if its rows are contiguous (row stride K) and it starts 16-byte aligned,
    else a fresh contiguous copy (the caching allocator aligns it): the only layout the kernel sees."""
    rows, k = x.shape
    if (x.stride(1) == 1 or k == 1) and (x.stride(0) == k or rows == 1) and x.data_ptr() % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _out_shape(x: torch.Tensor, keepdim: bool) -> tuple[int, ...]:
    return (*x.shape[:-1], 1) if keepdim else tuple(x.shape[:-1])


def row_mean(x: torch.Tensor, *, keepdim: bool = False, impl: str = "torch") -> torch.Tensor:
    """The mean of `x [..., K]` over its last dimension, as `x.mean(-1, keepdim=keepdim)`.

    Args:
        x: `[..., K]`, at least one dim, K >= 1, any leading shape and strides; bf16, fp16 or
            fp32 (the triton path; the torch path takes what `torch.mean` takes).
        keepdim: keep the reduced dim as size 1 (`[..., 1]`), as `torch.mean` does.
        impl: `"torch"` (the reference) or `"triton"` (already resolved,
            `dflash2.kernels.dispatch.resolve_impl`).
    Returns:
        `[...]` (`[..., 1]` with `keepdim`) in `x`'s dtype, accumulated in fp32. With
        `impl="triton"` each row's bits depend on that row's values, K and the dtype only.
    Raises:
        ValueError: an unresolved `impl`, or (triton) an input the kernel does not take (0-dim,
            K = 0, a dtype outside `DTYPES`, a tensor needing grad), each message naming the fix.
        RuntimeError: `impl="triton"` without the triton package.
    """
    if impl == "torch":
        return row_mean_reference(x, keepdim)
    if impl != "triton":
        raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
    if _tk is None:
        raise RuntimeError("impl='triton' needs the triton package; use impl='torch'")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"the row-mean kernel needs rows of K >= 1 elements, got shape {tuple(x.shape)}; "
                         "use impl='torch' (torch.mean gives NaN for K = 0)")
    if x.dtype not in DTYPES:
        raise ValueError(f"the row-mean kernel takes {DTYPES}, got {x.dtype}; use impl='torch' or cast x")
    if torch.is_grad_enabled() and x.requires_grad:
        raise ValueError("the row-mean kernel is inference-only (no autograd); use impl='torch' or torch.no_grad()")
    k = x.shape[-1]
    block_k = block_k_for(k, x.dtype)
    return _row_mean_triton(x.reshape(-1, k), block_k, _num_warps(block_k)).reshape(_out_shape(x, keepdim))


@torch.library.custom_op("dflash2::row_mean", mutates_args=())
def _row_mean_op(x: torch.Tensor, block_k: int, num_warps: int) -> torch.Tensor:
    """The Triton path as one opaque operator on `x [R, K]` -> `[R]`, so `torch.compile` keeps it
    whole (dynamo traces `RowMeanMode.__torch_function__` and emits this op; Inductor calls it as
    an extern kernel) with the eager call's block size and warps."""
    return _row_mean_triton(x, block_k, num_warps)


@_row_mean_op.register_fake
def _row_mean_fake(x, block_k, num_warps):
    return x.new_empty(x.shape[0])


def _parse_mean(func, args, kwargs) -> tuple[torch.Tensor, object, object, object] | None:
    """`(x, dim, keepdim, dtype)` of a `torch.mean` / `Tensor.mean` call with at most `(x, dim,
    keepdim)` positional and only `input`, `dim`, `keepdim`, `dtype` by name; None for any other
    call (other functions, `out=`, extra arguments)."""
    if func is not torch.Tensor.mean and func is not torch.mean:
        return None
    if len(args) > 3 or not _MEAN_KWARGS.issuperset(kwargs):
        return None
    if args:
        if "input" in kwargs:
            return None
        x, rest = args[0], args[1:]
    elif "input" in kwargs:
        x, rest = kwargs["input"], ()
    else:
        return None
    names = ("dim", "keepdim")
    if any(n in kwargs for n in names[:len(rest)]):
        return None  # given twice: leave torch's own error to torch
    bound = dict(zip(names, rest))
    dim, keepdim = bound.get("dim", kwargs.get("dim")), bound.get("keepdim", kwargs.get("keepdim", False))
    return x, dim, keepdim, kwargs.get("dtype")


class RowMeanMode(TorchFunctionMode):
    """Inside `with RowMeanMode(impl, device):`, a mean over the last dim runs `row_mean`'s Triton
    kernel and every other call runs unchanged, so the stock RMSNorms of a target get a
    row-invariant mean without modeling code of ours.

    Routed (`routes`): `impl == "triton"`; `torch.mean(x, dim, keepdim)` or `x.mean(dim, keepdim)`
    (positional or by name) with `dim` the last dim (`-1` or `x.dim() - 1`, an int or a
    one-element list / tuple), `keepdim` a bool either way, no `dtype` or `x`'s own, nothing
    else (no `out=`); `x` with K >= 1, a dtype in `DTYPES`, on the device type the impl was
    resolved for, and not needing grad while grad is enabled. With `impl == "torch"` the mode
    routes nothing (a no-op, so callers need no branch).

    Args:
        impl: a resolved `"torch"` or `"triton"` (`dflash2.kernels.dispatch.resolve_impl`).
        device: the device the model runs on.

    The mode keeps no state; the CUDA-graph contract is `row_mean`'s. Around `torch.compile`d
    modules, dynamo traces the routing and emits the opaque `dflash2::row_mean` operator, which
    runs the same kernel with the same block size, so compiled and eager calls give the same bits.
    """

    def __init__(self, impl: str, device: torch.device | str) -> None:
        super().__init__()
        if impl not in ("torch", "triton"):
            raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
        self.impl = impl
        self.device = torch.device(device)

    def routes(self, func, args: tuple = (), kwargs: dict | None = None) -> bool:
        """Whether the call `func(*args, **kwargs)` goes to the kernel under this mode."""
        return self._routed(func, args, kwargs or {}) is not None

    def _routed(self, func, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool] | None:
        """`(x, keepdim)` of a routed call, else None."""
        if self.impl != "triton":
            return None
        call = _parse_mean(func, args, kwargs)
        if call is None:
            return None
        x, dim, keepdim, dtype = call
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or not isinstance(keepdim, bool):
            return None
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if isinstance(dim, bool) or not isinstance(dim, int) or dim not in (-1, x.dim() - 1):
            return None
        if x.dtype not in DTYPES or (dtype is not None and dtype != x.dtype) or x.shape[-1] == 0:
            return None
        if x.device.type != self.device.type or (x.requires_grad and torch.is_grad_enabled()):
            return None
        return x, keepdim

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        routed = self._routed(func, args, kwargs)
        if routed is not None:
            x, keepdim = routed
            if torch.compiler.is_compiling():  # traced by dynamo: the opaque operator, same kernel
                return _compiled_call(x, keepdim)
            return row_mean(x, keepdim=keepdim, impl="triton")
        return func(*args, **kwargs)


def _compiled_call(x: torch.Tensor, keepdim: bool) -> torch.Tensor:
    """`row_mean(x, keepdim=keepdim, impl="triton")` through `dflash2::row_mean` (checks done by
    `RowMeanMode.routes`); the same kernel, block size and warps as the eager call."""
    block_k = block_k_for(x.shape[-1], x.dtype)
    out = _row_mean_op(x.reshape(-1, x.shape[-1]), block_k, _num_warps(block_k))
    return out.reshape(_out_shape(x, keepdim))
