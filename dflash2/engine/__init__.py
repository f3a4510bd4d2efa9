"""Inference engine: static target cache + per-row attention, speculative decoding loop
(draft, select, verify, commit), target-side sampling controls, acceptance statistics."""

from dflash2.engine.cache import ATTN_IMPLEMENTATION, StaticTargetCache, row_attention, static_attention
from dflash2.engine.draft import DFlash2Proposer, DraftStep, Proposal
from dflash2.engine.generate import SpeculativeOutput, speculative_generate
from dflash2.engine.kept import release_decode_state
from dflash2.engine.sampling import filter_logits, row_seed, row_seeds
from dflash2.engine.settings import EngineSettings
from dflash2.engine.stats import (
    StepTimes,
    accepted_length_histogram,
    per_position_acceptance,
    summarize,
    tau_per_request_mean,
    tau_pooled,
)

__all__ = [
    "ATTN_IMPLEMENTATION",
    "DFlash2Proposer",
    "DraftStep",
    "EngineSettings",
    "Proposal",
    "SpeculativeOutput",
    "StaticTargetCache",
    "StepTimes",
    "accepted_length_histogram",
    "filter_logits",
    "per_position_acceptance",
    "release_decode_state",
    "row_attention",
    "row_seed",
    "row_seeds",
    "speculative_generate",
    "static_attention",
    "summarize",
    "tau_per_request_mean",
    "tau_pooled",
]
