"""The DFlash2 arm (`dflash2@N=n`, kind "spec"): the draft checkpoint itself as the engine's draft
(the selector walk for a DFlash2 checkpoint, per-slot argmax for a v1 one)."""

from __future__ import annotations

from dflash2.evaluation.arms import ArmKind, register

KIND = register(ArmKind(name="spec", family="dflash2", flag="dflash2", order=1, uses_draft=True,
                        accept_check="draft", compare_suffix="", make_draft=lambda arm, ctx: ctx.draft))
