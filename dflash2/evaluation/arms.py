"""Arms of an evaluation run: what `speculative_generate` gets as its `draft` for each.

    ar                 draft=None (the AR baseline through the same engine loop)
    dflash2@N=n        the checkpoint itself (selector walk for DFlash2, argmax for v1)
    selector_off@N=n   the same checkpoint, per-slot argmax instead of the selector walk
                       (the engine's v1 path on a v2 model): isolates the selector's effect
    oracle@N=n         `OracleProposer` over the AR arm's tokens (controlled acceptance)

The selector-off arm wraps the engine's own `DFlash2Proposer` and switches its selector off
(exactly what the proposer does for a v1 checkpoint), so no engine code is duplicated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dflash2.engine.draft import DFlash2Proposer, DraftStep, Proposal
from dflash2.evaluation.oracle import DeviceOracleProposer, OracleProposer
from dflash2.kernels.dispatch import resolve_impl


@dataclass(frozen=True)
class Arm:
    """`label` is unique ("ar", "dflash2@N=7", ...); `kind` is "ar" | "spec" | "selector_off" | "oracle"."""

    label: str
    kind: str
    num_speculative_tokens: int


def build_arms(arms_cfg, *, has_draft: bool, draft_has_selector: bool) -> list[Arm]:
    """The run's arms, AR first (the others are compared to it and the oracle reads it).

    Args:
        arms_cfg: `ArmsSpec`.
        has_draft: a draft is available (spec and selector-off arms need one).
        draft_has_selector: False for v1 checkpoints (no selector-off arm: it would equal spec).
    Returns:
        list of `Arm`, labels unique.
    """
    arms = [Arm("ar", "ar", 0)]
    ns = sorted(set(int(n) for n in arms_cfg.num_speculative_tokens))
    if has_draft and arms_cfg.dflash2:
        arms += [Arm(f"dflash2@N={n}", "spec", n) for n in ns]
    if has_draft and arms_cfg.selector_off and draft_has_selector:
        arms += [Arm(f"selector_off@N={n}", "selector_off", n) for n in ns]
    if arms_cfg.oracle:
        ons = sorted(set(int(n) for n in (arms_cfg.oracle_num_speculative_tokens or ns)))
        arms += [Arm(f"oracle@N={n}", "oracle", n) for n in ons]
    return arms


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
        self.draft, self.target, self.impl = draft, target, impl
        self.attention_impl = resolve_impl(attention_impl, target.device)
        self.block_size = int(draft.block_size)
        self.target_layer_ids = list(draft.config.target_layer_ids)
        self._inner: DFlash2Proposer | None = None

    def propose(self, step: DraftStep) -> Proposal:
        if self._inner is None:
            batch, width = step.tokens.shape  # width = engine max_len + 1 (a trash column)
            # What DFlash2Proposer does for a v1 checkpoint: argmax per slot, k = 1.
            self._inner = DFlash2Proposer(self.draft, self.target, batch, width - 1, self.impl,
                                          attention_impl=self.attention_impl, use_selector=False)
        return self._inner.propose(step)


def draft_for_arm(arm: Arm, *, draft, target, impl: str, references: Sequence[Sequence[int]] | None = None,
                  seeds: Sequence[int] | None = None, accept_prob: float = 0.8):
    """The `draft` argument of `speculative_generate` for `arm` (None for AR).

    Args:
        references, seeds: oracle arms only: per row, prompt + AR tokens and the sample seed.
    """
    if arm.kind == "ar":
        return None
    if arm.kind == "spec":
        return draft
    if arm.kind == "selector_off":
        return SelectorOffProposer(draft, target, impl)
    if arm.kind == "oracle":
        if references is None or seeds is None:
            raise ValueError(f"arm {arm.label} needs the AR arm's tokens for its samples")
        kw = dict(block_size=arm.num_speculative_tokens + 1, accept_prob=accept_prob, vocab_size=target.vocab_size)
        if target.device.type == "cuda":
            # The device twin (same law, coins keyed on the device) runs inside the engine's CUDA
            # graphs like the other arms, so the oracle's speedup compares graph with graph.
            return DeviceOracleProposer(references, seeds, device=target.device, **kw)
        return OracleProposer(references, seeds, **kw)
    raise ValueError(f"unknown arm kind {arm.kind!r}")
