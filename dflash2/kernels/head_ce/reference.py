"""The reference for the head-CE kernel: the CE statistics and logit gradient in torch, and the
group maxima that `dflash2.training.losses.grouped_topk` reduces the top-k to.

For logits `z [N, V]`, labels `y [N]` and fp32 weights `coef [N]`:

    lse[i]      = logsumexp_v z[i, v]                          fp32
    grad[i, v]  = coef[i] * (softmax(z[i])[v] - [v == y[i]])   fp32 math, rounded once to z's dtype
    gmax[i, g]  = max_{v in group g} z[i, v]                   z's dtype (exact: a max rounds nothing)

`sum_i coef[i] * (lse[i] - z[i, y[i]])` is the weighted CE whose gradient `grad` is. This is the
CPU path and the path for vocabularies that are not a whole number of groups.
"""

from __future__ import annotations

import torch


def ce_grad_reference(z: torch.Tensor, y: torch.Tensor, coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(lse [N] fp32, grad [N, V] z.dtype)` of logits `z [N, V]`, labels `y [N]` and fp32 weights
    `coef [N]` (module docstring): fp32 math, the gradient rounded once to `z`'s dtype. Pure tensor
    code, so `torch.compile` can fuse it (`dflash2.training.losses.ce_and_logits_grad`)."""
    zf = z.float()
    lse = torch.logsumexp(zf, dim=-1)
    onehot = torch.arange(z.shape[-1], device=z.device)[None, :] == y[:, None]
    grad = ((torch.exp(zf - lse[:, None]) - onehot.float()) * coef[:, None]).to(z.dtype)
    return lse, grad


def head_ce_reference(z: torch.Tensor, y: torch.Tensor, coef: torch.Tensor, group: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(lse [N] fp32, grad [N, V] z.dtype, gmax [N, V // group] z.dtype)` (module docstring):
    `ce_grad_reference` and the maxima of `group`-column groups; `V % group == 0`."""
    N, V = z.shape
    lse, grad = ce_grad_reference(z, y, coef)
    return lse, grad, z.view(N, V // group, group).amax(-1)
