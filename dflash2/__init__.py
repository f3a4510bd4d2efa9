"""dflash2: distill DFlash2 speculative-decoding drafters and evaluate them losslessly."""

from dflash2.config import DFlash2Config, DFlash2ConfigError
from dflash2.modeling import DFlash2DraftModel
from dflash2.target import TargetModel

__all__ = ["DFlash2Config", "DFlash2ConfigError", "DFlash2DraftModel", "TargetModel", "speculative_generate"]
__version__ = "0.1.0"


def __getattr__(name):
    # The engine imports the model and kernels; load it on first use to keep `import dflash2` light.
    if name == "speculative_generate":
        from dflash2.engine import speculative_generate

        return speculative_generate
    raise AttributeError(name)
