"""Acceptance statistics: pooled vs per-request tau (both including the bonus), per-position
acceptance, accepted-length histogram."""

from __future__ import annotations

import math

from dflash2.engine import (
    accepted_length_histogram,
    per_position_acceptance,
    summarize,
    tau_per_request_mean,
    tau_pooled,
)
from dflash2.engine.stats import StepTimes

ACC = [[3, 3, 0], [1], []]  # row 0: 3 steps, row 1: 1 step, row 2: finished at prefill


def test_tau_pooled_and_per_request():
    assert tau_pooled(ACC) == (4 + 4 + 1 + 2) / 4
    assert tau_per_request_mean(ACC) == ((4 + 4 + 1) / 3 + 2 / 1) / 2  # the empty row is skipped
    assert math.isnan(tau_pooled([[], []])) and math.isnan(tau_per_request_mean([]))


def test_per_position_and_histogram():
    assert per_position_acceptance(ACC, 3) == [3 / 4, 2 / 4, 2 / 4]
    assert accepted_length_histogram(ACC, 3) == [1, 1, 0, 2]
    s = summarize(ACC, 3)
    assert s["steps"] == 4 and s["tau_pooled"] == tau_pooled(ACC)


def test_step_times_summary():
    t = StepTimes(prefill=0.5, draft=[0.1, 0.2], select=[0.01, 0.02], verify=[1.0, 2.0], total=4.0)
    s = t.summary()
    assert s["steps"] == 2 and abs(s["draft_s"] - 0.3) < 1e-12 and s["verify_s"] == 3.0
