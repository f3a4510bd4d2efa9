"""dflash2: distill DFlash2 speculative-decoding drafters and evaluate them losslessly.

The public names load on first use, so `import dflash2.evaluation.analysis.records` (say, for
`eval/report.py --same-tokens`, a comparison of two JSONL files) does not import transformers
and the model code first.
"""

from __future__ import annotations

import importlib

_PUBLIC = {"DFlash2Config": "dflash2.config", "DFlash2ConfigError": "dflash2.config",
           "DFlash2DraftModel": "dflash2.modeling", "TargetModel": "dflash2.target",
           "speculative_generate": "dflash2.engine"}

__all__ = list(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
