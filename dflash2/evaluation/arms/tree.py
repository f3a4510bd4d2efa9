"""The tree-verify arms (`tree<B>@N=n`, e.g. `tree32@N=15`): the drafter checkpoint with
`speculative_generate(..., verify="tree", tree_budget=B)`, one arm per budget B of
`arms.tree_budgets` (default 16, 32, 64) at each N of `arms.tree_num_speculative_tokens` (null =
`arms.num_speculative_tokens`). Each step's target forward scores a token tree of B nodes (the
root, the drafted chain, then best-first candidates by the selector's path scores; the engine
builds it from `Proposal.edges`, or from `log q` for a proposer without them;
`dflash2.engine.tree`) and commits the longest accepted root path: greedy output equals AR's.
A v1 checkpoint (one candidate per slot) gets the chain plus padding nodes: the tree adds nothing
there but its cost. Greedy and sampled, in exact mode too (there the engine confirms the
accepted path with a second, exact chain forward, which `arms.forward_rows` counts)."""

from __future__ import annotations

from dflash2.evaluation.arms import ArmKind, configured_ns, register


def _ns(arms_cfg) -> list[int]:
    return configured_ns(arms_cfg, arms_cfg.tree_num_speculative_tokens)


def _budgets(arms_cfg) -> list[int]:
    return sorted(set(int(b) for b in arms_cfg.tree_budgets))


KIND = register(ArmKind(name="tree", family="tree", flag="tree", order=4, uses_draft=True, accept_check="draft",
                        verify="tree", num_speculative_tokens=_ns, tree_budgets=_budgets,
                        make_draft=lambda arm, ctx: ctx.draft))
