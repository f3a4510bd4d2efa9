"""benchmarks/cost_model.py's step accounting (the GPU run itself is issue 7 item 5's device job)."""

from __future__ import annotations

import pytest

from dflash2.engine.generate import SpeculativeOutput
from dflash2.engine.stats import StepTimes

def _load():
    from benchmarks import cost_model

    return cost_model


def _out(times: StepTimes, accepted: list[list[int]]) -> SpeculativeOutput:
    return SpeculativeOutput(sequences=[], accepted=accepted, prompt_lengths=[10, 20], finish_reasons=["length"] * 2,
                             num_speculative_tokens=3, times=times)


def test_graph_runs_keep_replayed_whole_steps_only():
    mod = _load()
    # 6 steps: step 1 eager, step 2 a bucket's warm-up + capture (slow), then replays.
    t = StepTimes(verify=[0.050, 0.400, 0.010, 0.011, 0.012, 0.013], draft=[0.001], select=[0.001],
                  total=1.0, prefill=0.3, replayed=[False, False, True, True, True, True])
    steps = mod.steady_steps(_out(t, [[1, 2, 0, 3, 1, 0], [0, 0, 1, 1, 2, 3]]), 3)
    # Steps 0..4 are steady (the last step may be truncated); of those, replays 2, 3, 4 remain,
    # timed by their whole-step readings with nothing added.
    assert [s["s"] for s in steps] == [0.010, 0.011, 0.012]
    assert [s["tokens"] for s in steps] == [0 + 1 + 1 + 1, 3 + 1 + 1 + 1, 1 + 1 + 2 + 1]
    # mean committed context before step 2: row 0 at 10 + 2 + 3, row 1 at 20 + 1 + 1
    assert steps[0]["ctx"] == pytest.approx(((10 + 2 + 3) + (20 + 1 + 1)) / 2)


def test_eager_runs_share_the_unmeasured_remainder():
    mod = _load()
    t = StepTimes(verify=[0.01, 0.01, 0.01], draft=[0.002] * 3, select=[0.001] * 3, total=0.2, prefill=0.152)
    steps = mod.steady_steps(_out(t, [[1, 1, 1], [2, 2, 2]]), 3)
    rest = (0.2 - 0.152 - 3 * 0.013) / 3
    assert [s["s"] for s in steps] == pytest.approx([0.013 + rest] * 2)
