"""Acceptance statistics: pooled vs per-request tau (both including the bonus), per-position
acceptance, accepted-length histogram."""

from __future__ import annotations

import math

import pytest

from dflash2.engine import (
    accepted_length_histogram,
    per_position_acceptance,
    summarize,
    tau_per_request_mean,
    tau_pooled,
)
from dflash2.engine.stats import StepTimes, conditional_acceptance, produced_and_steps

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


def test_produced_and_steps_are_what_every_tau_is_a_ratio_of():
    produced, steps = produced_and_steps(ACC)
    assert produced.tolist() == [4 + 4 + 1, 2, 0] and steps.tolist() == [3, 1, 0]
    assert produced.sum() / steps.sum() == tau_pooled(ACC)
    has = steps > 0
    assert (produced[has] / steps[has]).mean() == tau_per_request_mean(ACC)


def test_conditional_acceptance_inverts_the_cumulative_product():
    u = per_position_acceptance(ACC, 3)  # [3/4, 2/4, 2/4]
    a = conditional_acceptance(u)
    assert a == [3 / 4, 2 / 3, 1.0]
    assert [a[0], a[0] * a[1], a[0] * a[1] * a[2]] == [3 / 4, 2 / 4, 2 / 4]
    assert conditional_acceptance([0.8, 0.0, 0.0]) == [0.8, 0.0, 0.0]  # nothing reaches past a zero
    assert conditional_acceptance([0.5, None, 0.1]) == [0.5, None, None]  # unmeasured stays unmeasured
    with pytest.raises(ValueError, match="must not increase"):
        conditional_acceptance([0.5, 0.7])
    with pytest.raises(ValueError, match=r"not in \[0, 1\]"):
        conditional_acceptance([1.5])
    with pytest.raises(ValueError, match="outside 0..3"):
        accepted_length_histogram([[4]], 3)


def test_step_times_summary():
    t = StepTimes(prefill=0.5, draft=[0.1, 0.2], select=[0.01, 0.02], verify=[1.0, 2.0], total=4.0)
    s = t.summary()
    assert s["steps"] == 2 and abs(s["draft_s"] - 0.3) < 1e-12 and s["verify_s"] == 3.0
