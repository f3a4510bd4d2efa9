"""The AR arm: `draft=None`, the autoregressive baseline through the same engine loop. Every other
arm is paired with it; it is always run, first in each chunk."""

from __future__ import annotations

from dflash2.evaluation.arms import ArmKind, register

KIND = register(ArmKind(name="ar", family="ar", flag="ar", order=0, baseline=True,
                        make_draft=lambda arm, ctx: None))
