"""Evaluation: datasets, scoring, sandboxed code execution, arms and sweeps, records,
statistics, reports, W&B and lm-eval.

Submodules are imported on first use (`dflash2.evaluation.stats`, ...), so importing the
package stays light: `eval/report.py` needs no torch model code, the sandbox needs no torch.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("arms", "config", "cost", "datasets", "lm_eval", "oracle", "records", "report", "run", "runner",
               "sandbox", "scoring", "sharding", "stats", "wandb_log")

__all__ = list(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
