"""Acceptance statistics derived from per-row, per-step accepted draft counts.

Conventions (spec 11.7): a step that accepts `a` draft tokens produces `a + 1` tokens (the
accepted drafts plus the bonus/corrected token), so every tau below *includes the bonus*.
The token sampled right after prefill is not a step and is not counted. Counts are the
verifier's decisions; a stop token or `max_new_tokens` may truncate what a step emits, but
not its recorded count (the same as the z-lab benchmark's acceptance lengths).

- `tau_pooled`: sum of produced tokens over all steps of all rows / total steps. Long
  requests weigh more. This is the number we report by default.
- `tau_per_request_mean`: each request's own tau (its produced / its steps), averaged over
  requests with at least one step. Short requests weigh as much as long ones.
- `per_position_acceptance`: for draft slot i = 1..N, the fraction of steps that accepted at
  least i tokens (slot i is only reached when slots < i were accepted).
- `accepted_length_histogram`: how many steps accepted exactly a = 0..N draft tokens.
- `produced_and_steps`: per request, tokens produced (sum of a + 1) and steps: the two arrays
  every tau above is a ratio of (and what a cluster bootstrap over requests resamples).
- `conditional_acceptance`: `a_i = P(slot i accepted | slots < i accepted) = u_i / u_{i-1}`
  from the unconditional `u_i` of `per_position_acceptance` (`u_0 = 1`).

This module is the one implementation of these statistics: the engine's own output
(`summarize`), the evaluation summaries (`dflash2.evaluation.analysis.stats`), the cost model
(`dflash2.evaluation.analysis.cost`) and the cross-run comparison all call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

Accepted = Sequence[Sequence[int]]  # per row, per step: accepted draft tokens


def _steps(accepted: Accepted) -> list[int]:
    return [a for row in accepted for a in row]


def produced_and_steps(accepted: Accepted) -> tuple[np.ndarray, np.ndarray]:
    """Per request (row): tokens produced including the bonus, `sum(a + 1)`, and its number of
    steps, as float arrays of shape `[rows]` each (a row without steps gives 0 and 0)."""
    produced = np.array([sum(int(a) + 1 for a in row) for row in accepted], dtype=float)
    steps = np.array([len(row) for row in accepted], dtype=float)
    return produced, steps


def tau_pooled(accepted: Accepted) -> float:
    """Pooled tau including the bonus: sum(a + 1) / number of steps (nan without steps)."""
    steps = _steps(accepted)
    return sum(a + 1 for a in steps) / len(steps) if steps else float("nan")


def tau_per_request_mean(accepted: Accepted) -> float:
    """Mean over requests of each request's tau (including the bonus); rows without steps skipped."""
    taus = [sum(a + 1 for a in row) / len(row) for row in accepted if len(row)]
    return sum(taus) / len(taus) if taus else float("nan")


def per_position_acceptance(accepted: Accepted, num_speculative_tokens: int) -> list[float]:
    """`[N]`: entry i-1 = fraction of steps with at least i accepted draft tokens."""
    steps = _steps(accepted)
    if not steps:
        return [float("nan")] * num_speculative_tokens
    return [sum(a >= i for a in steps) / len(steps) for i in range(1, num_speculative_tokens + 1)]


def conditional_acceptance(unconditional: Sequence[float | None]) -> list[float | None]:
    """`[N]`: `a_i = u_i / u_{i-1}` (`u_0 = 1`) from `u_i = P(at least i drafts accepted)`.

    A position whose `u` is None (not measured) gives None; after a position with `u = 0` every
    `a` is 0 (nothing reaches it, and a cost model must not draft there). Values in [0, 1].
    Raises ValueError when a `u` is outside [0, 1] or `u` increases with position.
    """
    out: list[float | None] = []
    prev: float | None = 1.0
    for u in unconditional:
        if u is None or prev is None:
            out.append(None)
            prev = None
            continue
        u = float(u)
        if not 0.0 <= u <= 1.0:
            raise ValueError(f"unconditional acceptance {u} is not in [0, 1]")
        if u > prev + 1e-12:
            raise ValueError(f"unconditional acceptance must not increase with position: {list(unconditional)}")
        out.append(min(u / prev, 1.0) if prev > 0 else 0.0)
        prev = u
    return out


def accepted_length_histogram(accepted: Accepted, num_speculative_tokens: int) -> list[int]:
    """`[N + 1]`: entry a = number of steps that accepted exactly a draft tokens."""
    hist = [0] * (num_speculative_tokens + 1)
    for a in _steps(accepted):
        if not 0 <= a <= num_speculative_tokens:
            raise ValueError(f"accepted count {a} outside 0..{num_speculative_tokens}")
        hist[a] += 1
    return hist


@dataclass
class StepTimes:
    """Wall time per decoding step (seconds), shared by all rows of the batch.

    `draft`: noise embedding + draft forward; `select`: target-head logits of the draft
    slots + vocabulary top-k + selector walk; `verify`: target forward over the block +
    logit filtering + acceptance + commit. Device work is synchronized before each reading
    only when the engine runs with `timing=True`. Otherwise, on the pipelined graph path,
    `verify` holds the wall time between two step reports arriving (one extra step on finished
    rows may be among them), and on other asynchronous paths the readings are launch times.
    `launch` (graph mode) holds, per step, the host time of the runner's call (never synchronized):
    for a replayed step, its launch, the part of the host's per-step work a pipelined loop hides.
    """

    prefill: float = 0.0
    draft: list[float] = field(default_factory=list)
    select: list[float] = field(default_factory=list)
    verify: list[float] = field(default_factory=list)
    total: float = 0.0
    synchronized: bool = False
    graph_captures: int = 0
    replayed: list[bool] = field(default_factory=list)  # graph mode: per step, a replay (False: eager/capture)
    launch: list[float] = field(default_factory=list)  # graph mode: per step, host seconds in the runner's call
    graph_error: str | None = None  # graph mode: why a capture failed (the call then finished eagerly)
    # The batched prefill in graph mode: "replay" (a graph captured by an earlier call of its shape),
    # "capture" (run eagerly, then captured for later calls) or "eager" (no graph: not the graph
    # path, exact mode "rows", or a failed capture).
    prefill_graph: str = "eager"

    @property
    def graph_replays(self) -> int:
        """Steps replayed from a CUDA graph (their whole time is in `verify`)."""
        return sum(self.replayed)

    def summary(self) -> dict[str, float]:
        """Totals per phase (seconds) and the step count."""
        return {
            "prefill_s": self.prefill,
            "draft_s": sum(self.draft),
            "select_s": sum(self.select),
            "verify_s": sum(self.verify),
            "total_s": self.total,
            "steps": float(len(self.verify)),
        }


def summarize(accepted: Accepted, num_speculative_tokens: int) -> dict:
    """All derived acceptance numbers in one dict (for JSONL records and reports)."""
    return {
        "tau_pooled": tau_pooled(accepted),
        "tau_per_request_mean": tau_per_request_mean(accepted),
        "per_position_acceptance": per_position_acceptance(accepted, num_speculative_tokens),
        "accepted_length_histogram": accepted_length_histogram(accepted, num_speculative_tokens),
        "steps": len(_steps(accepted)),
    }
