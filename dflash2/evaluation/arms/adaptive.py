"""The adaptive-verify arm (`adaptive@N=n`): the drafter checkpoint as the DFlash2 arm runs it, with
`speculative_generate(..., verify="adaptive")`: each row's verify length at step k is `L_k` in
1..N, set by that row's own earlier accepted counts (`dflash2.engine.verify`: +2 after a step that
accepted all of its L, else -1), lossless as the chain (greedy equals AR). Its records carry the
per-step lengths; its forward still scores N + 1 rows (`arms.forward_rows`), a ragged one would
score L + 1 (`arms.verify_rows`), which the cost model prices beside it. At each N of
`arms.adaptive_num_speculative_tokens` (null = `arms.num_speculative_tokens`); v1 checkpoints too."""

from __future__ import annotations

from dflash2.evaluation.arms import ArmKind, configured_ns, register


def _ns(arms_cfg) -> list[int]:
    return configured_ns(arms_cfg, arms_cfg.adaptive_num_speculative_tokens)


KIND = register(ArmKind(name="adaptive", family="adaptive", flag="adaptive", order=3, uses_draft=True,
                        accept_check="draft", verify="adaptive", num_speculative_tokens=_ns,
                        make_draft=lambda arm, ctx: ctx.draft))
