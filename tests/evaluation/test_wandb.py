"""W&B logging for real in offline mode (no mock), and the W&B Report's panels (built, not saved)."""

from __future__ import annotations

import json

import pytest

from dflash2.evaluation.analysis.stats import summarize
from dflash2.evaluation.analysis.wandb_log import build_report, flat_metrics, log_run, read_offline_run
from dflash2.runconfig import LoggerSpec
from tests.evaluation.synthetic import synthetic_records


@pytest.fixture(scope="module")
def run():
    recs = synthetic_records(n_per_dataset=4, ns=(3, 7), flip={"dflash2@N=7": [0]})
    return recs, summarize(recs, n_resamples=200)


def test_disabled_logs_nothing(run, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    recs, s = run
    assert log_run(s, recs, LoggerSpec(mode="disabled"), {}, tmp_path) is None
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="logger.mode='offlien'"):
        log_run(s, recs, LoggerSpec(mode="offlien"), {}, tmp_path)


def test_offline_run_holds_the_logged_summary(run, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    recs, s = run
    (tmp_path / "summary.json").write_text(json.dumps(s))
    run_dir = log_run(s, recs, LoggerSpec(mode="offline", project="dflash2-test", tags=["ci"]),
                      {"target": {"name": "tiny-qwen3"}, "seed": 0}, tmp_path)
    assert run_dir is not None and "offline-run-" in run_dir
    logged = read_offline_run(run_dir, wait_s=0)  # log_run returns once the log is complete
    assert logged["complete"]
    summary, want = logged["summary"], flat_metrics(s)
    for key in ("dflash2@N=7/tau_pooled", "dflash2@N=7/speedup", "dflash2@N=7/speedup_ci_low",
                "dflash2@N=3/gsm8k/accuracy", "dflash2@N=7/mcnemar_p", "n_samples"):
        assert summary[key] == pytest.approx(want[key]), key
    assert summary["dflash2@N=7/tau_pooled"] == pytest.approx(s["per_arm"]["dflash2@N=7"]["overall"]["tau_pooled"])
    assert summary["records"]["_type"] == "table-file" and summary["records"]["nrows"] == len(recs)
    assert summary["summary_table"]["nrows"] == len(s["arms"])
    assert summary["plots/tau_vs_n"]["_type"] == "image-file"
    assert logged["config"]["target"] == {"name": "tiny-qwen3"} and logged["config"]["seed"] == 0
    assert run_dir.endswith(logged["run_id"])
    # The vs-N series is in the history against n_spec.
    rows = [h for h in logged["history"] if "vs_n/dflash2/speedup" in h]
    assert [h["n_spec"] for h in rows] == [3, 7]
    assert rows[1]["vs_n/dflash2/speedup"] == pytest.approx(s["vs_n"]["dflash2"]["speedup"][1])
    pos = [h for h in logged["history"] if "acceptance/dflash2@N=7" in h]
    assert [h["position"] for h in pos] == list(range(1, 8))
    # The table file and saved summary are in the run's files.
    table = next((tmp_path / "wb").rglob("records_*.table.json"))
    assert len(json.loads(table.read_text())["data"]) == len(recs)


def test_report_panels_over_logged_keys(run):
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.expr import expr_to_filters

    recs, s = run
    report = build_report("my-team/dflash2-test/abc123", s)
    assert isinstance(report, wr.Report) and report.entity == "my-team" and report.project == "dflash2-test"
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    assert len(grids) == 1
    runset = grids[0].runsets[0]
    assert "abc123" in str(expr_to_filters(runset.filters))
    lines = {p.title: p for p in grids[0].panels if isinstance(p, wr.LinePlot)}
    assert lines["speedup vs AR vs N"].x == "n_spec" and lines["speedup vs AR vs N"].y == ["vs_n/dflash2/speedup"]
    assert lines["per-position acceptance"].y == ["acceptance/dflash2@N=3", "acceptance/dflash2@N=7"]
    bars = {p.title: p for p in grids[0].panels if isinstance(p, wr.BarPlot)}
    keys = set(flat_metrics(s))
    for p in bars.values():  # every bar reads a key log_run writes
        assert p.metrics and set(p.metrics) <= keys, p.title
    media = next(p for p in grids[0].panels if isinstance(p, wr.MediaBrowser))
    assert "plots/speedup_vs_n" in media.media_keys
    tables = {p.table_name for p in grids[0].panels if isinstance(p, wr.WeavePanelSummaryTable)}
    assert tables == {"records", "summary_table"}
    with pytest.raises(ValueError, match="entity"):
        build_report("dflash2-test/abc123", s)
