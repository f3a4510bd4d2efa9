"""The reference for the row-mean kernel: `torch.mean` over the last dimension itself.

`y[...] = (1 / K) * sum_k x[..., k]` for `x [..., K]`, in `x`'s dtype (fp32 accumulation for
16-bit inputs, as `torch.mean` does); `[..., 1]` with `keepdim`. This is the CPU path and the
autograd path. Its summation order is PyTorch's, which on CUDA depends on the tensor's shape
(so a row's bits may change with the number of rows); the Triton kernel's does not.
"""

from __future__ import annotations

import torch


def row_mean_reference(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """`x.mean(-1, keepdim=keepdim)`: `x [..., K]` -> `[...]`, or `[..., 1]` with `keepdim`."""
    return x.mean(-1, keepdim=keepdim)
