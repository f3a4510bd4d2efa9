"""The oracle arm (`oracle@N=n`): proposes the AR arm's own tokens, each slot right with
probability `arms.oracle_accept_prob` (a controlled acceptance rate, for checks and cost models),
at each N of `arms.oracle_num_speculative_tokens` (null = `arms.num_speculative_tokens`)."""

from __future__ import annotations

from dflash2.evaluation.arms import Arm, ArmKind, DraftContext, configured_ns, register


def _ns(arms_cfg) -> list[int]:
    return configured_ns(arms_cfg, arms_cfg.oracle_num_speculative_tokens)


def make_draft(arm: Arm, ctx: DraftContext):
    """An `OracleProposer` over `ctx.references` (prompt + AR tokens per row) and `ctx.seeds`; on
    CUDA its device twin (same law, coins keyed on the device), which runs inside the engine's CUDA
    graphs like the other arms, so the oracle's speedup compares graph with graph."""
    from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer, OracleProposer

    if ctx.references is None or ctx.seeds is None:
        raise ValueError(f"arm {arm.label} needs the AR arm's tokens for its samples")
    if ctx.arms_cfg is None:
        raise ValueError(f"arm {arm.label} needs the run's arms config (arms.oracle_accept_prob)")
    kw = dict(block_size=arm.num_speculative_tokens + 1, accept_prob=float(ctx.arms_cfg.oracle_accept_prob),
              vocab_size=ctx.target.vocab_size)
    if ctx.target.device.type == "cuda":
        return DeviceOracleProposer(ctx.references, ctx.seeds, device=ctx.target.device, **kw)
    return OracleProposer(ctx.references, ctx.seeds, **kw)


KIND = register(ArmKind(name="oracle", family="oracle", flag="oracle", order=5, needs_references=True,
                        accept_check="oracle", num_speculative_tokens=_ns, make_draft=make_draft))
