"""The reference for the small-M linear kernel: `torch.nn.functional.linear` itself.

`y = x @ weight.T + bias` for `x [..., K]`, `weight [N, K]`, `bias [N] | None`, `y [..., N]`
in `x`'s dtype; on CUDA this is cuBLAS, on CPU the CPU path, and it is the autograd path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`: `x [..., K]`, `weight [N, K]`, `bias [N]` -> `[..., N]`."""
    return F.linear(x, weight, bias)
