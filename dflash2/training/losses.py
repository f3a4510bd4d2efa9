"""Distillation objective (spec 3.4-3.5, 6.3) and the validation signals of DESIGN.md section 4.

Per trained slot i >= 1 of a block anchored at p (teacher = target at p+i-1, label y = its argmax):

    unary      CE(l_i, y)  (default)      or  KL(softmax(teacher) || softmax(l_i))   (loss=kl)
    selector   C = topk(l_i, k); if y not in C: C[k-1] = y      (missing-target injection)
               S = l_i[C] + transition(h_i, pred_i, C);  CE(S, index of y in C)
    weights    w_i = exp(-(i-1)/gamma);  per row  sum_i w_i m_i loss_i / (sum_i m_i + 1e-5)
    total      mean over rows of (unary + alpha * selector)

Decisions (spec 11), stated once here:
- predecessor `data` (default): pred_i = x_{p+i-1}, the data token (teacher forced; equals the
  target's greedy token on regenerated data); `self`: the selector's own greedy pick at slot
  i-1 (the serving walk is self-conditioned), slot 1 starting from the anchor.
- CE on the teacher argmax by default (the DFlash paper), KL as an option; gamma 7 for B=16
  (5 for 10, 4 for 8, else 7*B/16).
- Nothing detached by default (speculators); `selector_stop_grad` makes the selector CE see
  detached unary logits and hidden states, so the backbone learns from the unary loss only.
- `teacher_forced_selector_acc` counts the selector's pick over the ORIGINAL top-k (no
  injection) against all valid slots, so it is bounded by recall@K.

The LM head dominates memory and time ([slots, V] fp32 logits), so the head and both losses run
over chunks of anchors. Two implementations of the head's CE (`head_loss`, chosen once):
- `autograd` (the reference): logits in the autograd graph; with `checkpoint_head` each chunk's
  logits are recomputed in backward instead of kept;
- `fused` (the default where it applies: CE on a plain head, no multiplier or softcap): the
  frozen head's CE gradient is computed in the forward pass, `coef * (softmax - onehot)` in fp32
  math over the chunk's logits (`ce_and_logits_grad`, compiled on CUDA), then one GEMM with the
  head weight; no logits are kept for backward or recomputed. The selector reads the same logit
  values at its candidates, its gradient entering through `h . W[cand]` (a straight-through term
  of value zero). The loss values equal the reference's up to rounding of the fp32 reductions;
  the gradients differ only in where the CE and selector parts are summed before the bf16 GEMM
  (tests/training/test_losses.py).
  On CUDA (`kernel_impl="triton"`) the logsumexp, the logit gradient and the group maxima of the
  top-k come from one launch of `dflash2.kernels.head_ce`, which reads the logits twice instead of
  three times; the loss, the top-k and the gradients are the same up to that kernel's fp32
  rounding (tests/kernels/test_head_ce.py, tests/training/test_losses.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dflash2.kernels.head_ce import head_ce
from dflash2.kernels.head_ce.reference import ce_grad_reference
from dflash2.kernels.selector.reference import transition_scores

TOPK_GROUP = 128  # columns per group of `grouped_topk` (and of the head-CE kernel's group maxima)


def default_gamma(block_size: int) -> float:
    """Decay gamma paired with the block size (spec 3.5: 7 for 16; 5 for 10 and 4 for 8 recalled)."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(int(block_size), 7.0 * block_size / 16)


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """`[Bk]` weights: 0 at the anchor slot, `exp(-(i-1)/gamma)` for i >= 1."""
    i = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.exp(-(i - 1) / float(gamma))
    w[0] = 0.0
    return w


@dataclass
class ObjectiveSpec:
    loss: str = "ce"                 # ce | kl
    gamma: float | None = None       # None: default_gamma(block size)
    selector_alpha: float = 1.0
    selector_stop_grad: bool = False
    predecessor: str = "data"        # data | self
    chunk_anchors: int = 64          # anchors per head/loss chunk
    checkpoint_head: bool = True     # autograd head: recompute each chunk's logits in backward
    head_loss: str = "auto"          # auto | fused | autograd (see the module docstring)

    def check(self) -> None:
        if self.loss not in ("ce", "kl"):
            raise ValueError(f"train.loss={self.loss!r}: use ce or kl")
        if self.predecessor not in ("data", "self"):
            raise ValueError(f"train.predecessor={self.predecessor!r}: use data or self")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"train.gamma={self.gamma}: use a positive decay (7 for block 16) or null")
        if self.chunk_anchors < 1:
            raise ValueError(f"train.chunk_anchors={self.chunk_anchors}: use >= 1")
        if self.head_loss not in ("auto", "fused", "autograd"):
            raise ValueError(f"train.head_loss={self.head_loss!r}: use auto, fused or autograd")
        if self.head_loss == "fused" and self.loss != "ce":
            raise ValueError("train.head_loss=fused computes the CE gradient; with train.loss=kl use auto or autograd")


def stat_names(block_size: int) -> list[str]:
    n = block_size - 1
    return ([f"pos_correct_{i}" for i in range(1, n + 1)] + [f"pos_count_{i}" for i in range(1, n + 1)]
            + ["recall_hits", "tf_selector_hits", "slots", "blocks", "run_unary", "run_oracle", "run_path",
               "target_mass"])


def _lead(ok: torch.Tensor) -> torch.Tensor:
    """Number of leading True along the last dim: `[..., n] -> [...]`."""
    return ok.to(torch.int32).cumprod(-1).sum(-1)


class DistillObjective(nn.Module):
    """Wraps the draft (the very `DFlash2DraftModel` the engine runs) with the training loss, so
    accelerate/DDP/FSDP wrap one module whose forward returns the loss.

    The frozen target's `embed` and `head` are passed per call, never registered here.
    `kernel_impl` (`"torch"` or `"triton"`, resolved by the caller, `dflash2.kernels.dispatch`)
    picks the fused head loss's row kernel: `"triton"` runs `dflash2.kernels.head_ce` where the
    vocabulary is a whole number of top-k groups, `"torch"` the reference ops.
    """

    def __init__(self, draft: nn.Module, spec: ObjectiveSpec, kernel_impl: str = "torch"):
        super().__init__()
        spec.check()
        self.draft = draft
        self.spec = spec
        if draft.selector_enabled is False and spec.selector_alpha and spec.predecessor == "self":
            raise ValueError("train.predecessor=self needs a DFlash2 draft (v1 has no selector)")
        gamma = spec.gamma or default_gamma(draft.block_size)
        self.register_buffer("weights", position_weights(draft.block_size, gamma), persistent=False)
        cfg = draft.config
        plain_head = cfg.output_multiplier == 1.0 and not cfg.final_logit_softcapping > 0
        if spec.head_loss == "fused" and not plain_head:
            raise ValueError("train.head_loss=fused needs a plain head (no output multiplier or logit softcap)")
        self.fused_head = spec.head_loss == "fused" or (spec.head_loss == "auto" and spec.loss == "ce" and plain_head)
        if kernel_impl not in ("torch", "triton"):
            raise ValueError(f"kernel_impl must be a resolved 'torch' or 'triton', got {kernel_impl!r}")
        V, k = cfg.vocab_size, cfg.selector_top_k
        self.head_rows = "triton" if (kernel_impl == "triton" and self.fused_head and V % TOPK_GROUP == 0
                                      and V // TOPK_GROUP >= k) else "torch"
        self._ce_grad = ce_and_logits_grad          # compiled on the first CUDA call (`_chunk`)
        self.compiled = False

    def compile_forward(self) -> None:
        """Run `forward` (the draft, both losses and their statistics) as one `torch.compile`d
        function from now on (Inductor, static shapes: one compile per padded length, and one more
        for the no-grad held-out pass). The CE gradient then stays inside that graph instead of
        its own compiled kernel. Same math as eager; Inductor's fusions change rounding only."""
        self.compiled = True
        self.forward = torch.compile(self.forward, dynamic=False)

    def forward(self, batch: dict[str, torch.Tensor], mask, embed, head, head_weight=None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of one micro-batch.

        Args:
            batch: `input_ids, position_ids [Bt, S]`, `features [Bt, S, n*H]`, `teacher_next [Bt, S]`
                (target argmax at each position), `h_last [Bt, S, H]` (KL only), and the layout
                tensors `block_ids, block_pos, data_idx, label_mask, pred_ids [Bt, A, Bk]`,
                `anchor_valid [Bt, A]`.
            mask: dense bool mask `[Bt, 1, Q, S+Q]` or a FlexAttention `BlockMask`.
            embed, head: the target's frozen input embedding and LM head callables.
            head_weight: the head's `[V, H]` weight (`head(h) == h @ head_weight.T`), needed by the
                fused head loss.
        Returns:
            `(loss scalar, parts [3 + len(stat_names)])`: detached `[loss, unary, selector]` then stats.
        """
        d, sp = self.draft, self.spec
        block_ids = batch["block_ids"]
        Bt, A, Bk = block_ids.shape
        with torch.no_grad():
            noise = d.noise_embedding(embed, block_ids.flatten(1))            # [Bt, Q, H]
        pos = torch.cat([batch["position_ids"], batch["block_pos"].flatten(1)], dim=1)
        h = d(pos, noise, batch["features"], attention_mask=mask, block_len=Bk)   # [Bt, Q, H]
        h = h.view(Bt, A, Bk, -1)[:, :, 1:]                                  # slots 1..Bk-1
        prev_idx = (batch["data_idx"] - 1).clamp(min=0)[:, :, 1:]            # teacher position p+i-1
        y = batch["teacher_next"].gather(1, prev_idx.flatten(1)).view(Bt, A, Bk - 1)
        m = batch["label_mask"][:, :, 1:]
        # Per-row normalization (spec 3.5), then the mean over rows: identical under DDP sharding.
        denom = m.sum(dim=(1, 2), dtype=torch.float32) + 1e-5                 # [Bt]
        coef = self.weights[1:] * m / denom[:, None, None] / Bt               # [Bt, A, Bk-1]
        pred = batch["pred_ids"][:, :, 1:]
        anchor_tok = block_ids[:, :, 0]
        h_last = batch.get("h_last")
        unary = torch.zeros((), device=h.device)
        selector = torch.zeros((), device=h.device)
        stats = None
        for a0 in range(0, A, sp.chunk_anchors):                             # chunks of anchors, not anchors
            sl = slice(a0, a0 + sp.chunk_anchors)
            teacher_h = None
            if h_last is not None:
                teacher_h = h_last.gather(1, prev_idx[:, sl].flatten(1)[..., None].expand(-1, -1, h_last.shape[-1]))
                teacher_h = teacher_h.view(*prev_idx[:, sl].shape, -1)
            args = (h[:, sl], y[:, sl], pred[:, sl], coef[:, sl], m[:, sl], anchor_tok[:, sl],
                    batch["anchor_valid"][:, sl], teacher_h)
            fn = lambda *a: self._chunk(head, head_weight, *a)  # noqa: E731
            if sp.checkpoint_head and torch.is_grad_enabled() and not self.fused_head:
                u, s, st = checkpoint(fn, *args, use_reentrant=False)
            else:
                u, s, st = fn(*args)
            unary, selector = unary + u, selector + s
            stats = st if stats is None else stats + st
        loss = unary + sp.selector_alpha * selector
        parts = torch.cat([torch.stack([loss, unary, selector]).detach().double(), stats])
        return loss, parts

    # ------------------------------------------------------------------ one chunk of anchors
    def _chunk(self, head, head_weight, h, y, pred, coef, m, anchor_tok, anchor_valid, teacher_h):
        """Losses and stats of `c` anchors. Shapes: `h [Bt, c, n, H]`, `y, pred, coef, m [Bt, c, n]`,
        `anchor_tok, anchor_valid [Bt, c]`, `teacher_h [Bt, c, n, H]` or None (n = Bk - 1)."""
        d, sp = self.draft, self.spec
        shape = y.shape                                                      # [Bt, c, n]
        h = h.reshape(-1, h.shape[-1])
        y, pred, coef, m = y.reshape(-1), pred.reshape(-1), coef.reshape(-1), m.reshape(-1)
        sel = d.candidate_selector
        mass = torch.zeros((), device=h.device, dtype=torch.float64)
        if self.fused_head:
            if (self.head_rows == "torch" and h.device.type == "cuda" and self._ce_grad is ce_and_logits_grad
                    and not self.compiled):
                self._ce_grad = _compiled_or_eager(ce_and_logits_grad)
            with torch.no_grad():
                z = head(h)                                                  # [N, V], the head's dtype
                k = min(d.config.selector_top_k, z.shape[-1])
                if self.head_rows == "triton":                               # one launch: lse, grad, group maxima
                    lse, grad_z, gmax = head_ce(z, y, coef, group=TOPK_GROUP, impl="triton")
                    value = weighted_ce(lse, z, y, coef)
                    topv, topi = grouped_topk(z, k, group_max=gmax)
                else:
                    topv, topi = grouped_topk(z, k)                          # [N, k] sorted
                    value, grad_z = self._ce_grad(z, y, coef)                # grad_z [N, V] in z's dtype
                topv = topv.float()
                grad_h = (grad_z.to(head_weight.dtype) @ head_weight).to(h.dtype)
                del grad_z
            unary = _ValueWithGrad.apply(h, value, grad_h)
        else:
            logits = draft_logits(d, h, head)                                # [N, V] fp32 (2-D: one GEMM)
            if sp.loss == "ce":
                ul = F.cross_entropy(logits, y, reduction="none")
            else:
                with torch.no_grad():
                    logp_t = F.log_softmax(head(teacher_h.reshape(-1, teacher_h.shape[-1])).float(), dim=-1)
                ul = (logp_t.exp() * (logp_t - F.log_softmax(logits, dim=-1))).sum(-1)
            unary = (coef * ul).sum()
            k = min(d.config.selector_top_k, logits.shape[-1])
            topv, topi = logits.detach().topk(k, dim=-1)                     # [N, k] sorted
        cand = torch.cat([topi, y[..., None]], dim=-1)                       # [N, k+1]: top-k plus y
        in_top = topi == y[..., None]
        hit = in_top.any(-1)
        if sp.loss == "kl":
            with torch.no_grad():
                mass = (logp_t.exp().gather(-1, topi).sum(-1) * m).sum().double()
        mb = m.bool()
        selector = torch.zeros((), device=h.device)
        tf_hits = torch.zeros((), device=h.device)
        path_ok = torch.zeros_like(mb)
        if sel is not None:
            hs = h.detach() if sp.selector_stop_grad else h
            eta = sel.gate(hs)                                               # [N, R]
            with torch.no_grad():
                picks = self._walk(topv.view(*shape, k), topi.view(*shape, k), eta.detach().view(*shape, -1),
                                   anchor_tok).reshape(-1)                   # greedy walk, [N]
            path_ok = picks == y
            if sp.predecessor == "self":
                pred = torch.cat([anchor_tok[..., None], picks.view(shape)[..., :-1]], dim=-1).reshape(-1)
            if self.fused_head:   # the logits at the candidates; gradient through h . W[cand]
                u_cand = z.gather(-1, cand).float()
                if not sp.selector_stop_grad:
                    u_cand = u_cand + _zero_with_grad(h, head_weight, cand)
            else:
                u_cand = (logits.detach() if sp.selector_stop_grad else logits).gather(-1, cand)
            s_ext = u_cand + transition_scores(pred, eta, cand, sel.predecessor_codebook, sel.successor_codebook)
            s_orig = s_ext[..., :k]
            s_inj = torch.where(hit[..., None], s_orig, torch.cat([s_orig[..., :k - 1], s_ext[..., k:]], -1))
            label = torch.where(hit, in_top.to(torch.int64).argmax(-1), torch.full_like(y, k - 1))
            sl = torch.logsumexp(s_inj, -1) - s_inj.gather(-1, label[..., None]).squeeze(-1)
            selector = (coef * sl).sum()
            with torch.no_grad():
                tf_pick = topi.gather(-1, s_orig.detach().argmax(-1, keepdim=True)).squeeze(-1)
                tf_hits = ((tf_pick == y) & mb).sum()
        with torch.no_grad():
            correct = ((topi[..., 0] == y) & mb).view(shape)
            hit, mb, path_ok = hit.view(shape), mb.view(shape), path_ok.view(shape)
            blocks = anchor_valid
            st = torch.cat([
                correct.sum(dim=(0, 1)).double(), mb.sum(dim=(0, 1)).double(),
                torch.stack([(hit & mb).sum().double(), tf_hits.double(), mb.sum().double(),
                             blocks.sum().double(),
                             (_lead(correct) * blocks).sum().double(),
                             (_lead(hit & mb) * blocks).sum().double(),
                             (_lead(path_ok & mb) * blocks).sum().double(), mass])])
        return unary, selector, st

    def _walk(self, topv, topi, eta, anchor_tok):
        """Greedy selector walk from the anchor over the unary top-k (the serving walk at T=0).
        `topv, topi [Bt, c, n, k]`, `eta [Bt, c, n, R]`, `anchor_tok [Bt, c]` -> picks `[Bt, c, n]`."""
        sel = self.draft.candidate_selector
        prev, picks = anchor_tok, []
        for j in range(topi.shape[2]):                                       # slots of a block (Bk-1)
            s = topv[:, :, j] + transition_scores(prev, eta[:, :, j], topi[:, :, j], sel.predecessor_codebook,
                                                  sel.successor_codebook)
            prev = topi[:, :, j].gather(-1, s.argmax(-1, keepdim=True)).squeeze(-1)
            picks.append(prev)
        return torch.stack(picks, dim=-1)


def ce_and_logits_grad(z: torch.Tensor, y: torch.Tensor, coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sum_i coef_i * CE(z_i, y_i)` and its gradient with respect to the logits, in fp32 math.

    Args:
        z: logits `[N, V]` (bf16 or fp32); y: labels `[N]`; coef: `[N]` fp32 weights.
    Returns:
        `(loss scalar fp32, grad [N, V] in z's dtype)`: `coef * (softmax(z) - onehot(y))`, what
        autograd gives through `z.float()` before its cast back. Pure tensor code: compiled on
        CUDA (`DistillObjective._ce_grad`: one pass for the row statistics, one for the gradient).
    """
    lse, grad = ce_grad_reference(z, y, coef)
    return weighted_ce(lse, z, y, coef), grad


def weighted_ce(lse: torch.Tensor, z: torch.Tensor, y: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """`sum_i coef_i * (lse_i - z_i[y_i])` in fp32: the weighted CE from the rows' logsumexp `lse [N]`
    and the logits `z [N, V]` at the labels `y [N]`."""
    return (coef * (lse - z.gather(-1, y[:, None]).squeeze(-1).float())).sum()


def _compiled_or_eager(fn):
    """`fn` compiled (Inductor); if compiling fails at the first call, the eager `fn` from then on
    (the same math), with one warning naming the error."""
    compiled = torch.compile(fn, dynamic=False)
    state = {"impl": None}

    def call(*args):
        if state["impl"] is None:
            try:
                out = compiled(*args)
                state["impl"] = compiled
                return out
            except Exception as e:   # noqa: BLE001  (any compiler failure: run the reference)
                import warnings

                warnings.warn(f"{fn.__name__}: torch.compile failed ({type(e).__name__}: {e}); running it eagerly",
                              stacklevel=2)
                state["impl"] = fn
        return state["impl"](*args)

    return call


def grouped_topk(z: torch.Tensor, k: int, group: int = TOPK_GROUP, group_max: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(z, k)` (sorted, largest) over the last dim of `z [N, V]`, in two small steps
    when `V` is a multiple of `group` with at least `k` groups: the top-k groups by their
    maximum hold every top-k element (each of the k largest values lies in a group whose
    maximum is at least the k-th largest, and at most k groups have one), then the top-k of
    those groups' `k * group` values. The same values as `torch.topk`; among exactly tied
    values the indices may differ (torch.topk leaves that order unspecified too).
    `group_max [N, V // group]`: the groups' maxima if already computed (`head_ce` gives them)."""
    N, V = z.shape
    if V % group or V // group < k:
        return z.topk(k, dim=-1)
    zg = z.view(N, V // group, group)
    gmax = zg.amax(-1) if group_max is None else group_max
    top_groups = gmax.topk(k, dim=-1).indices                               # [N, k]
    cand = zg.gather(1, top_groups[:, :, None].expand(-1, -1, group)).view(N, k * group)
    vals, j = cand.topk(k, dim=-1)
    idx = top_groups.gather(1, j // group) * group + j % group
    return vals, idx


class _ValueWithGrad(torch.autograd.Function):
    """`value` (a precomputed scalar) whose gradient with respect to `h` is `grad_h`."""

    @staticmethod
    def forward(ctx, h, value, grad_h):
        ctx.save_for_backward(grad_h)
        return value.clone()

    @staticmethod
    def backward(ctx, g):
        (grad_h,) = ctx.saved_tensors
        return grad_h * g, None, None


def _zero_with_grad(h: torch.Tensor, weight: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """`[N, c]` zeros whose gradient with respect to `h [N, H]` is that of the logits `h . W[cand]`."""
    e = torch.bmm(weight[cand].to(h.dtype), h[..., None]).squeeze(-1).float()   # [N, c]
    return e - e.detach()


def draft_logits(draft, h: torch.Tensor, head) -> torch.Tensor:
    """`draft.head_logits` for training: the same `softcap(multiplier * head(h))` in fp32, minus
    the identity multiply/softcap passes (each a full [N, V] op in forward and backward)."""
    cfg = draft.config
    z = head(h).float()
    if cfg.output_multiplier != 1.0:
        z = z * cfg.output_multiplier
    if cfg.final_logit_softcapping > 0:
        z = cfg.final_logit_softcapping * torch.tanh(z / cfg.final_logit_softcapping)
    return z


def summarize_stats(parts: torch.Tensor, block_size: int, n_micro: int = 1) -> dict[str, float]:
    """Turn summed `parts` (from `DistillObjective.forward`, added over micro-batches and
    processes) into the logged metrics. tau figures include the bonus (pooled over blocks)."""
    vals = parts.double().cpu().tolist()
    loss, unary, selector = (v / max(n_micro, 1) for v in vals[:3])
    names = stat_names(block_size)
    st = dict(zip(names, vals[3:]))
    n = block_size - 1
    slots, blocks = max(st["slots"], 1.0), max(st["blocks"], 1.0)
    acc = [st[f"pos_correct_{i}"] / max(st[f"pos_count_{i}"], 1.0) for i in range(1, n + 1)]
    out = {"loss": loss, "loss_unary": unary, "loss_selector": selector,
           "full_acc": sum(st[f"pos_correct_{i}"] for i in range(1, n + 1)) / slots,
           "tau_proxy": 1.0 + st["run_unary"] / blocks,
           "eal": sum(math.prod(acc[:j]) for j in range(1, n + 1)),
           "recall_at_k": st["recall_hits"] / slots,
           "oracle_tau": 1.0 + st["run_oracle"] / blocks,
           "tf_selector_acc": st["tf_selector_hits"] / slots,
           "path_tau": 1.0 + st["run_path"] / blocks,
           "slots": st["slots"], "blocks": st["blocks"]}
    if st["target_mass"]:
        out["target_mass_at_k"] = st["target_mass"] / slots
    for i, a in enumerate(acc, start=1):
        out[f"acc_pos_{i}"] = a
    return out
