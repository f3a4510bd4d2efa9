"""Grouped dynamic depthwise convolution around a draft sublayer (spec 4.2-4.3).

    u  = RMSNorm(x);  D = W_kp u  -> [.., 2, K, G]          (one projection per sublayer)
    u' = Conv(u; base[0], D[:, 0])   "prepare", feeds the sublayer
    y' = Conv(y; base[1], D[:, 1])   "finish", applied to the sublayer output y
    Conv(z; b, d)[i, c] = sum_t [i mod block_len >= t] (b[t, c] + d[i, t, c // g]) z[i - t, c]

Taps never cross a block boundary. Identity init (`base[:, 0] = 1`, `base[:, 1:] = 0`,
`W_kp = 0`) makes a fresh DFlash2 layer compute exactly what a DFlash v1 layer computes.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash2.kernels.dispatch import resolve_impl
from dflash2.kernels.dynamic_conv import grouped_dynamic_conv, grouped_dynamic_conv_norm


_NORM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what the fused finish + norm launch takes


class GroupedDynamicConv(nn.Module):
    """Parameters keep the checkpoint layout: `base_kernel [2, K, H]`,
    `kernel_projection.weight [2*K*G, H]` (row = side*K*G + tap*G + group).

    `impl` (`auto | torch | triton`) is resolved once, at the first forward after it is set or
    after the module moves (`.to(...)`): resolving reads the environment (TRITON_INTERPRET) and
    probes for Triton, which has no place in a per-step forward (STYLE 3).
    """

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int, impl: str = "auto"):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size {group_size} must divide hidden_size {hidden_size}")
        self.hidden_size, self.kernel_size, self.group_size = hidden_size, kernel_size, group_size
        self.num_groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.num_groups, bias=False)
        self._resolved: str | None = None
        self.impl = impl
        self.reset_to_identity()

    @property
    def impl(self) -> str:
        """The requested implementation, `"auto" | "torch" | "triton"`."""
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        self._impl, self._resolved = value, None

    def _apply(self, fn, recurse=True):
        # A move to another device can change what "auto" means: resolve again on next use.
        self._resolved = None
        return super()._apply(fn, recurse)

    @torch.no_grad()
    def reset_to_identity(self) -> None:
        self.base_kernel.zero_()
        self.base_kernel[:, 0, :] = 1.0
        self.kernel_projection.weight.zero_()

    def project(self, u: torch.Tensor) -> torch.Tensor:
        """Dynamic kernel offsets from the normed sublayer input: [B, T, H] -> [B, T, 2*K*G]."""
        return self.kernel_projection(u)

    def forward(self, z: torch.Tensor, proj: torch.Tensor, side: int, block_len: int,
                impl: str | None = None, residual: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Apply side 0 (prepare) or 1 (finish) to `z [B, T, H]`; returns `[B, T, H]`, plus
        `residual [B, T, H]` if given: `residual + out` with PyTorch's type promotion. Of `z`'s
        dtype, that is one call (one launch with `"triton"`, the bits of the separate add); of
        another (mixed-precision training: an fp32 residual stream around bf16 autocast
        sublayers), the conv and then the add, promoted as `x + conv(y)` always was.

        `impl`: this call's implementation, resolved (`"torch"` or `"triton"`, as the engine's
        settings pass it); None = the module's own `impl`, resolved once. `out`: a `[B, T, H]`
        tensor of `z`'s dtype (any strides) that receives the result (inference without a
        residual: the prepared block rows written where the attention's stacked projection reads
        them); ignored with a residual of another dtype."""
        if impl is None:
            if self._resolved is None:
                self._resolved = resolve_impl(self._impl, self.base_kernel.device)
            impl = self._resolved
        elif impl not in ("torch", "triton"):
            raise ValueError(f"conv impl for a call must be a resolved 'torch' or 'triton', got {impl!r}")
        # Inputs choose the path (STYLE 5): anything that needs autograd runs the reference.
        tensors = (z, proj, self.base_kernel) + (() if residual is None else (residual,))
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            impl = "torch"
        if residual is not None and residual.dtype != z.dtype:
            return residual + grouped_dynamic_conv(z, self.base_kernel, proj, side, block_len, self.group_size,
                                                   impl=impl)
        return grouped_dynamic_conv(z, self.base_kernel, proj, side, block_len, self.group_size, impl=impl,
                                    residual=residual, out=out)

    def finish_norm(self, y: torch.Tensor, proj: torch.Tensor, block_len: int, impl: str,
                    residual: torch.Tensor, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """`(x, norm(x))` with `x = residual + finish(y)` (`forward(y, proj, 1, block_len, impl,
        residual=residual)`), where `norm` is the RMSNorm that reads `x` next (`weight [H]` and
        `variance_epsilon`, as transformers' RMSNorms hold them). One launch
        (`grouped_dynamic_conv_norm`) with `impl == "triton"`, `y`, `residual` and the norm's
        weight of one dtype the kernel takes (bf16, fp16, fp32), and nothing needing grad: `x` the
        bits of the separate call, `norm(x)` the module's up to its sum's order. Otherwise the
        call and then the module."""
        tensors = (y, proj, self.base_kernel, residual, norm.weight)
        if (impl == "triton" and residual.dtype == y.dtype == norm.weight.dtype and y.dtype in _NORM_DTYPES
                and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))):
            return grouped_dynamic_conv_norm(y, self.base_kernel, proj, 1, block_len, self.group_size, residual,
                                             norm.weight, norm.variance_epsilon, impl="triton")
        x = self(y, proj, 1, block_len, impl, residual=residual)
        return x, norm(x)
