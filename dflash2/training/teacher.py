"""The frozen target's pass over a training batch: context features and the teacher's argmax.

`target_pass` is one no-grad forward of the stock target modules over packed sequences, with a
block-diagonal causal mask so packed documents never see each other. `TeacherPass` is what the
trainer calls: on CUDA it holds that forward in CUDA graphs (`dflash2.engine.graphs.StepGraphs`),
one per batch shape `[rows, S]`. The trainer pads every batch to a multiple of `train.pad_to`
(256 on CUDA), so a run has a handful of shapes (the training batch, the held-out batches). The
eager forward of a 0.5B target is a few hundred kernel launches, whose host time bounded the
compiled step (docs/PERFORMANCE.md, "Distillation"); a replay is one launch. Graph and eager
forwards run the same kernels on the same inputs, so the outputs are the same bits.
"""

from __future__ import annotations

import torch

from dflash2.engine.graphs import StepGraphs

# The batch entries the target pass reads.
INPUT_KEYS = ("input_ids", "position_ids", "doc_ids")


@torch.no_grad()
def target_pass(target, batch: dict[str, torch.Tensor], layer_ids: list[int], *, keep_last: bool,
                chunk: int = 1024) -> dict[str, torch.Tensor]:
    """Features, teacher argmax (and the final-normed state for KL) of packed sequences.

    Args:
        target: `TargetModel`; batch: `input_ids, position_ids, doc_ids [Bt, S]`.
        layer_ids: the draft's `target_layer_ids`; keep_last: also return `h_last`.
        chunk: positions per head call for the argmax ([Bt, chunk, V] live at once).
    Returns:
        `features [Bt, S, n*H]`, `teacher_next [Bt, S]` (argmax of the target's logits at each
        position, i.e. its greedy next token), and `h_last [Bt, S, H]` when `keep_last`.
    """
    ids, doc = batch["input_ids"], batch["doc_ids"]
    S = ids.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=ids.device).tril()
    mask = ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]        # [Bt, 1, S, S] block-diagonal
    last = target.num_layers - 1
    want = list(layer_ids) + ([last] if last not in layer_ids else [])
    out = target(ids, position_ids=batch["position_ids"], attention_mask=mask, layer_ids=want, logits_to_keep=1)
    H = target.hidden_size
    feats = out.features
    j = want.index(last)
    h_last = feats[..., j * H:(j + 1) * H]
    teacher = torch.cat([target.head(h_last[:, s:s + chunk]).argmax(-1) for s in range(0, S, chunk)], dim=1)
    res = {"features": feats[..., :len(layer_ids) * H], "teacher_next": teacher}
    if keep_last:
        res["h_last"] = h_last
    return res


class TeacherPass:
    """`teacher(batch)` -> `target_pass(target, batch, layer_ids, keep_last=keep_last)`, through
    CUDA graphs when `graphs` is set.

    Args:
        target: the frozen `TargetModel`.
        layer_ids: the draft's `target_layer_ids`.
        keep_last: also return `h_last` (the KL loss).
        graphs: hold the pass in one CUDA graph per input shape (CUDA only). The first batch of a
            shape runs eagerly (the warm-up a capture needs) and is then captured; later batches
            of that shape are copied into the shape's static inputs and replay the graph. If a
            capture fails, `StepGraphs` warns once and every later pass runs eagerly (same
            outputs, slower).

    Every call returns tensors the caller owns (copies of the graph's static outputs, which the
    next replay overwrites), so several batches' outputs may be held at once (gradient
    accumulation, prefetch).
    """

    def __init__(self, target, layer_ids: list[int], *, keep_last: bool, graphs: bool) -> None:
        self.target, self.layer_ids, self.keep_last = target, list(layer_ids), keep_last
        self.inputs: dict[tuple[int, ...], dict[str, torch.Tensor]] = {}  # per shape, the static inputs
        self.graphs = StepGraphs(self._body, target.device, "the target's training pass") if graphs else None

    def eager(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The pass without graphs (any shape: the per-sequence target cache uses it)."""
        return target_pass(self.target, batch, self.layer_ids, keep_last=self.keep_last)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.graphs is None:
            return self.eager(batch)
        key = tuple(batch["input_ids"].shape)
        static = self.inputs.get(key)
        if static is None:
            static = self.inputs[key] = {k: torch.empty_like(batch[k]) for k in INPUT_KEYS}
        for k in INPUT_KEYS:
            static[k].copy_(batch[k])
        _, out = self.graphs.run(key)
        return {k: v.clone() for k, v in out.items()}

    def _body(self, key: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """The pass over the static inputs of shape `key` (what a graph holds)."""
        return self.eager(self.inputs[key])
