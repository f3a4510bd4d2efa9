"""DFlash2 draft model: decoder layers with context K/V, grouped dynamic conv, candidate selector."""

from dflash2.modeling.cache import DraftContextCache
from dflash2.modeling.conv import GroupedDynamicConv
from dflash2.modeling.draft import DFlash2DraftModel, DraftAttention, DraftDecoderLayer
from dflash2.modeling.selector import CandidateSelector

__all__ = ["DFlash2DraftModel", "DraftAttention", "DraftDecoderLayer", "GroupedDynamicConv",
           "CandidateSelector", "DraftContextCache"]
