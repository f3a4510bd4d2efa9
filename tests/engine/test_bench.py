"""`python -m benchmarks.engine` on CPU with the tiny shape: the table has a row per requested
(context, batch, arm), its ratios are the raw JSON's, budgets skip cells with a row, parts split
the grid and merge back, targets are judged against their thresholds, bad arguments fail clearly."""

from __future__ import annotations

import json

import pytest

from benchmarks import engine as bench
from benchmarks import wallclock

BASE = ["--shape", "tiny", "--device", "cpu", "--new-tokens", "6", "--warmup-steps", "2", "--repeats", "1"]
ARMS = [bench.HF_EAGER, bench.HF_COMPILE, bench.OURS_AR, "ours N=1", "ours N=3"]


def table(md: str, ctx: int) -> dict[tuple[int, str], list[str]]:
    """Rows of the `## Context ctx` table keyed by (batch, arm), cells as strings."""
    lines = md.split(f"## Context {ctx}\n", 1)[1].split("\n\n", 1)[0].splitlines()[3:]
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[int(cells[0]), cells[1]] = cells[2:]
    return rows


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    run = bench.main(BASE + ["--batch", "1,2", "--context", "8,24", "--n", "1,3",
                             "--out", str(d / "a.md"), "--json", str(d / "a.json")])
    return (d / "a.md").read_text(), json.loads((d / "a.json").read_text()), run


def test_rows_ratios_and_floors_match_raw_json(full_run):
    md, raw, run = full_run
    assert raw["cells"] == json.loads(json.dumps(run["cells"]))
    assert "python -m benchmarks.engine --shape tiny --device cpu" in md.split("## Context")[0]
    assert "Device: CPU" in md
    cells = {(c["context"], c["batch"], c["arm"]): c for c in raw["cells"]}
    assert len(cells) == len(raw["cells"]) == 2 * 2 * len(ARMS)
    for ctx in (8, 24):
        rows = table(md, ctx)
        assert set(rows) == {(b, a) for b in (1, 2) for a in ARMS}
        for (batch, arm), cols in rows.items():
            c = cells[ctx, batch, arm]
            if arm == bench.HF_COMPILE:
                assert c["status"] == cols[0] == bench.NA_CPU
                continue
            assert c["status"] == "ok"
            ms, in_step, host, tok_step, tok_s, x_eager, x_compile, x_floor, phases, peak = cols
            hf = cells[ctx, batch, bench.HF_EAGER]["ms_step"]
            assert float(ms) == pytest.approx(c["ms_step"], abs=0.006)
            extra = c["extra"]  # ms/step is the wall clock of whole calls, every arm alike
            assert c["ms_step"] == pytest.approx((extra["call_ms"] - extra["one_token_call_ms"]) / extra["steps"])
            if arm == bench.HF_EAGER:
                assert in_step == host == "-" and extra["steps"] == 5
            else:
                assert float(in_step) == pytest.approx(c["in_step_ms"], abs=0.006) and c["in_step_ms"] > 0
                assert float(host) == pytest.approx(c["host_ms_step"], abs=0.0006)
                assert c["host_ms_step"] == pytest.approx(c["ms_step"] - c["in_step_ms"])
            assert float(tok_s) == pytest.approx(batch * c["tokens_step"] / c["ms_step"] * 1e3, abs=0.06)
            assert float(x_eager) == pytest.approx(hf / c["ms_step"], abs=0.006)
            assert x_compile == "-" and peak == bench.NA_CPU
            f = c["floors"]
            assert f["m_rows"] == batch * (c["n"] + 1)
            assert f["floor_ms"] == max(f["memory_ms"], f["gemm_stack_ms"], f["compute_ms"]) > 0
            assert float(x_floor) == pytest.approx(c["ms_step"] / f["floor_ms"], abs=0.006)
            if arm.startswith("ours N="):
                d, s, v = (float(x) for x in phases.split(" / "))
                assert d > 0 and s > 0 and v > 0
                assert f["weights_gb"] > cells[ctx, batch, bench.OURS_AR]["floors"]["weights_gb"]  # + draft
                assert c["tokens_step"] >= 1.0
            else:
                assert tok_step == "1.00"
    g = raw["floors"]
    assert g["copy_gbs"] > 0 and g["gemm_tflops"] > 0
    assert "## Targets" in md and "| AR step, batch 1, context 512 <= 4.6 ms | - | not run |" in md


def test_budget_skips_cells_with_rows(tmp_path):
    run = bench.main(BASE + ["--batch", "1", "--context", "8", "--n", "1", "--budget-s", "0",
                             "--out", str(tmp_path / "b.md")])
    status = {c["arm"]: c["status"] for c in run["cells"]}
    assert status == {bench.OURS_AR: bench.NOT_RUN_BUDGET, "ours N=1": bench.NOT_RUN_BUDGET,
                      bench.HF_EAGER: bench.NOT_RUN_BUDGET, bench.HF_COMPILE: bench.NA_CPU}
    rows = table((tmp_path / "b.md").read_text(), 8)
    assert rows[1, "ours N=1"][0] == rows[1, bench.HF_EAGER][0] == bench.NOT_RUN_BUDGET


def test_parts_split_the_grid_and_merge(tmp_path):
    assert bench.select_part([512, 4096], [1, 8, 32], "1") == [(512, 1), (512, 8), (512, 32)]
    assert bench.select_part([512, 4096], [1, 8, 32], "2") == [(4096, 1), (4096, 8)]
    assert bench.select_part([512, 4096], [1, 8, 32], "3") == [(4096, 32)]
    assert len(bench.select_part([512, 4096], [1, 8, 32], "all")) == 6
    common = BASE + ["--batch", "1,2", "--context", "8,16", "--n", "1", "--arms", "ours"]
    for part in ("1", "2", "3"):
        bench.main(common + ["--part", part, "--json", str(tmp_path / f"p{part}.json")])
    bench.main(["--merge", *(str(tmp_path / f"p{p}.json") for p in "123"), "--out", str(tmp_path / "m.md")])
    md = (tmp_path / "m.md").read_text()
    assert set(table(md, 8)) == {(b, a) for b in (1, 2) for a in (bench.OURS_AR, "ours N=1")}
    assert set(table(md, 16)) == {(b, a) for b in (1, 2) for a in (bench.OURS_AR, "ours N=1")}
    assert md.count("--part") == 3 and all(f"- part {p}:" in md for p in "123")


def test_targets_are_judged_against_their_thresholds():
    def cell(ctx, batch, arm, ms, host=None):
        return {"context": ctx, "batch": batch, "arm": arm, "n": 0, "status": "ok", "ms_step": ms,
                "host_ms_step": host, "tokens_step": 1.0}
    cells = [cell(512, 1, bench.OURS_AR, 4.5, 0.05), cell(512, 1, "ours N=15", 6.5, 0.4),
             cell(512, 1, bench.HF_COMPILE, 6.3), cell(512, 8, bench.OURS_AR, 10.0), cell(512, 8, "ours N=7", 12.4),
             cell(512, 32, bench.OURS_AR, 10.0), cell(512, 32, "ours N=3", 12.6)]
    bench.add_ratios(cells)
    got = {label: (measured, status) for label, measured, status in bench.targets(cells)}
    assert got["AR step, batch 1, context 512 <= 4.6 ms"] == ("4.50 ms", "met")
    assert got["AR step >= 1.6x faster than HF static+compile (batch 1, context 512)"] == ("1.40x", "missed")
    assert got["gate: AR step >= 1.3x faster than HF static+compile (batch 1, context 512)"] == ("1.40x", "met")
    assert got["speculative step N=15, batch 1, context 512 <= 6.0 ms"] == ("6.50 ms", "missed")
    assert got["gate: N=15 step faster than HF static+compile's token (batch 1, context 512)"] == ("0.97x", "missed")
    assert got["host ms/step <= 0.1 (ours AR, batch 1, context 512)"] == ("0.050 ms", "met")
    assert got["host ms/step <= 0.1 (ours N=15, batch 1, context 512)"] == ("0.400 ms", "missed")
    assert got["spec step N=7 within 1.25x of AR step, batch 8, context 512"] == ("1.24x", "met")
    assert got["spec step N=3 within 1.25x of AR step, batch 32, context 512"] == ("1.26x", "missed")
    cells[0]["status"] = bench.NOT_RUN_BUDGET
    bench.add_ratios(cells)
    assert bench.targets(cells)[0][2] == "not run"


@pytest.mark.parametrize("argv, message", [
    (["--n", "1,16"], "N must be in 1..15"),
    (["--shape", "qwen3-9b"], "invalid choice: 'qwen3-9b'"),
    (["--context", "512", "--part", "2"], "--part 2 selects no cell"),
    (["--new-tokens", "4"], "--new-tokens 4: needs at least"),
    (["--batch", "0"], "expected positive integers"),
    (["--arms", "ours,vllm"], "--arms: unknown ['vllm']"),
])
def test_bad_arguments_fail_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--shape", "tiny", "--device", "cpu", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_qwen3_8b_needs_cuda(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--shape", "qwen3-8b", "--device", "cpu"])
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_every_arm_runs_on_cuda(tmp_path):
    """The CUDA-only parts (compiled HF arm, CUDA-graph GEMM stack, peak memory) on the tiny shape:
    a quick check on the device before the Qwen3-8B calls."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    run = bench.main(["--shape", "tiny", "--device", "cuda", "--batch", "1,2", "--context", "16", "--n", "1,15",
                      "--new-tokens", "8", "--json", str(tmp_path / "g.json"), "--out", str(tmp_path / "g.md")])
    for c in run["cells"]:
        assert c["status"] == "ok", (c["arm"], c["status"])
        assert c["peak_gib"] > 0 and c["floors"]["gemm_stack_ms"] > 0
    compiled = [c for c in run["cells"] if c["arm"] == bench.HF_COMPILE]
    assert compiled and all(c["extra"]["compiled"] for c in compiled)
    assert all(c["x_hf_compile"] is not None for c in run["cells"])


def test_wall_clock_step_and_the_oracle_split_of_a_graph_step(monkeypatch):
    """ms/step is the wall clock of whole calls, (t(12 tokens) - t(1 token)) / steps; on CUDA a
    step is one replay, and the in-step split is that step minus the device oracle's step at the
    same N. Stand-in engine on a fake clock: a call costs 1 ms plus 12 ms per step; its
    synchronized steps read 10 ms with the draft and 7 ms with the oracle."""
    import torch

    from dflash2.engine import generate
    from dflash2.engine.generate import SpeculativeOutput
    from dflash2.engine.stats import StepTimes
    from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer

    seen, now = [], [0.0]
    monkeypatch.setattr(wallclock, "wall_clock", lambda: now[0])

    def fake(target, drafter, ids, **kw):
        oracle = isinstance(drafter, DeviceOracleProposer)
        seen.append(("oracle" if oracle else type(drafter).__name__, kw["max_new_tokens"], kw.get("timing", False)))
        # Every call of a cell gets the cell's engine kwargs, and nothing else of ours.
        assert kw.get("linear_impl", "torch") == "torch"
        assert kw.get("compile_level") == ("light" if drafter is not None else None)
        steps = -(-(kw["max_new_tokens"] - 1) // 2)  # two tokens a step
        now[0] += (1.0 + 12.0 * steps) / 1e3
        ms = 7.0 if oracle else 10.0
        times = StepTimes(verify=[0.05] + [ms / 1e3] * (steps - 1), replayed=[False] + [True] * (steps - 1),
                          launch=[0.05] + [0.4e-3] * (steps - 2) + [0.9e-3])
        n = kw["num_speculative_tokens"] or 0
        acc = min(n, 1)  # a speculative step accepts one draft token here, an AR step none
        return SpeculativeOutput([], [[acc] * steps, [acc] * (steps - 1)], [4, 4], ["length"] * 2, n, times)

    monkeypatch.setattr(generate, "speculative_generate", fake)
    target, draft = bench.build_models("tiny", torch.device("cpu"))
    ids = torch.randint(0, 100, (2, 8))
    res = bench.run_ours(target, draft, ids, 3, 12, 2, {"compile_level": "light", "linear_impl": "torch"}, repeats=2)
    d = "DFlash2DraftModel"
    assert seen == [(d, 12, False), (d, 12, False), (d, 12, False), (d, 1, False), (d, 1, False), (d, 12, True),
                    ("oracle", 12, True)]  # warm-up, 2 timed x (12, 1) tokens, synchronized run, oracle run
    assert res["ms_step"] == pytest.approx(12.0) and res["extra"]["steps"] == 6
    assert res["in_step_ms"] == pytest.approx(10.0) and res["host_ms_step"] == pytest.approx(2.0)
    assert res["phases_ms"]["verify"] == pytest.approx(7.0)
    assert res["phases_ms"]["draft_select"] == pytest.approx(3.0)
    # The readings of the last whole-length call (after the warm-up steps): step wall time and launch.
    ex = res["extra"]
    assert len(ex["calls_ms"]) == len(ex["one_token_calls_ms"]) == 2
    assert ex["pipelined_step_ms"] == pytest.approx(10.0) and ex["pipelined_step_max_ms"] == pytest.approx(10.0)
    assert ex["launch_ms"] == pytest.approx(0.4) and ex["launch_max_ms"] == pytest.approx(0.9)
    row = bench.render([{"meta": {"part": "all", "command": "x", "wall_s": 1.0, "device_name": "d", "torch": "t",
                                  "transformers": "t", "shape": "tiny", "shape_desc": "s", "new_tokens": 12,
                                  "warmup_steps": 2},
                         "floors": {"copy_gbs": 1.0, "gemm_tflops": 1.0, "linear_params": 1,
                                    "kv_bytes_per_token": 1},
                         "cells": [{"context": 8, "batch": 2, "arm": "ours N=3", "n": 3, "status": "ok",
                                    "peak_gib": None, "floors": None, **res}]}])
    assert "| 2 | ours N=3 | 12.00 | 10.00 | 2.000 |" in row and "3.00 / 7.00 (oracle diff.)" in row
    ar = bench.run_ours(target, None, ids, 0, 12, 2)
    assert ar["phases_ms"] == {"draft": None, "select": None, "verify": None}  # nothing to split for AR


def test_exact_arms_sit_beside_the_normal_ones_with_their_cost(tmp_path):
    """`--exact-impl rows`: each of our arms also runs in exact mode; the exact arm's cost ratio is its
    wall ms/step over the normal arm's of the same cell, and the table lists it."""
    run = bench.main(BASE + ["--batch", "1", "--context", "8", "--n", "3", "--arms", "ours", "--exact-impl", "rows",
                             "--out", str(tmp_path / "e.md"), "--json", str(tmp_path / "e.json")])
    cells = {c["arm"]: c for c in run["cells"]}
    normal = {bench.OURS_AR, "ours N=3"}
    assert set(cells) == normal | {arm + bench.EXACT_SUFFIX for arm in normal}
    for arm in (bench.OURS_AR, "ours N=3"):
        exact = cells[arm + bench.EXACT_SUFFIX]
        assert exact["status"] == "ok"
        assert exact["exact_cost"] == pytest.approx(exact["ms_step"] / cells[arm]["ms_step"])
    md = (tmp_path / "e.md").read_text()
    assert "## Exact mode's cost" in md and "`exact_impl` rows, compile level none" in md
    assert "| 8 | 1 | ours N=3 exact |" in md


def test_gc_pauses_times_each_collection_inside_the_block_only():
    import gc

    before = list(gc.callbacks)
    with wallclock.gc_pauses() as pauses:
        gc.collect()
        gc.collect(0)
    gc.collect()  # outside: not recorded
    assert len(pauses) == 2 and all(p > 0 for p in pauses) and gc.callbacks == before
