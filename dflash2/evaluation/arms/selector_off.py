"""The selector-off arm (`selector_off@N=n`): the same checkpoint with per-slot argmax proposals
instead of the selector walk (the engine's v1 path on a v2 model), which isolates the selector's
effect. It wraps the engine's own `DFlash2Proposer` and switches its selector off (exactly what the
proposer does for a v1 checkpoint), so no engine code is duplicated; v1 checkpoints, which have no
selector, get no such arm (it would equal the DFlash2 arm)."""

from __future__ import annotations

from dflash2.evaluation.arms import Arm, ArmKind, DraftContext, register


class SelectorOffProposer:
    """The draft with per-slot argmax proposals (one-hot q), even when it has a selector.

    A fresh instance is needed per `speculative_generate` call: the wrapped proposer owns the
    draft's context cache, sized on the first `propose` from the engine's token buffer.

    Args:
        draft: a `DFlash2DraftModel`.
        target: the `TargetModel`.
        impl: resolved kernel implementation ("torch" | "triton").
        attention_impl: the draft's cached attention, `"auto"` (the engine's default: Triton on
            CUDA) | `"torch"` | `"triton"`, resolved here once.
    """

    graph_safe = True  # device work only; the inner proposer is built at step 1, which always runs eagerly

    def __init__(self, draft, target, impl: str, attention_impl: str = "auto"):
        from dflash2.kernels.dispatch import resolve_impl

        self.draft, self.target, self.impl = draft, target, impl
        self.attention_impl = resolve_impl(attention_impl, target.device)
        self.block_size = int(draft.block_size)
        self.target_layer_ids = list(draft.config.target_layer_ids)
        self._inner = None

    def propose(self, step):
        """`DFlash2Proposer.propose` with `use_selector=False` (a `Proposal` for the `DraftStep`)."""
        if self._inner is None:
            from dflash2.engine.draft import DFlash2Proposer

            batch, width = step.tokens.shape  # width = engine max_len + 1 (a trash column)
            # What DFlash2Proposer does for a v1 checkpoint: argmax per slot, k = 1.
            self._inner = DFlash2Proposer(self.draft, self.target, batch, width - 1, self.impl,
                                          attention_impl=self.attention_impl, use_selector=False)
        return self._inner.propose(step)


def make_draft(arm: Arm, ctx: DraftContext) -> SelectorOffProposer:
    return SelectorOffProposer(ctx.draft, ctx.target, ctx.impl)


KIND = register(ArmKind(name="selector_off", family="selector_off", flag="selector_off", order=2, uses_draft=True,
                        requires_selector=True, accept_check="draft", compare_suffix=", selector off",
                        make_draft=make_draft))
