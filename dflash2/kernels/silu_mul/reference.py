"""`silu(gate) * up`, the SwiGLU product of a stock MLP (`act_fn(gate_proj(x)) * up_proj(x)`), in
PyTorch: the definition the Triton kernel is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`F.silu(gate) * up` (eager PyTorch: the SiLU rounded to the dtype, then the product)."""
    return F.silu(gate) * up
