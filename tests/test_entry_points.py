"""The entry points a user runs (`train/distill.py`, `train/regenerate.py`, `eval/run.py`), run
in-process as a user runs them (a subprocess would pay the imports again): every config value is
checked before any work, a refused run writes nothing (an existing run's directory stays
byte-identical), a user error is one `error:` line on stderr with exit status 2 (the traceback
only with DFLASH2_DEBUG=1), and the end-of-run summaries say what a run produced and where."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from dflash2.entrypoint import unknown_keys

ROOT = Path(__file__).resolve().parents[1]
DISTILL, REGENERATE, EVAL = (ROOT / "train" / "distill.py", ROOT / "train" / "regenerate.py", ROOT / "eval" / "run.py")


def _run(script: Path, *overrides: str, monkeypatch, capsys) -> tuple[int, str, str]:
    """Run `script` with `overrides` as its command line; returns (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", [str(script), *overrides])
    status = 0
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return status, out.out, out.err


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(root.rglob("*"))}


def _refused(script, *overrides, monkeypatch, capsys, match: str) -> str:
    status, out, err = _run(script, *overrides, monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert status == 2, (status, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err       # one line: no banner, no traceback
    assert match in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Run from an empty directory, so "writes nothing anywhere" covers the current directory too."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("DFLASH2_DEBUG", raising=False)
    return cwd


@pytest.mark.parametrize("override, match", [
    ("+train.lrr=1", "train.lrr: unknown key"),                       # Hydra's own hint, refused too
    ("train.lrr=1", "did you mean train.lr?"),
    ("train.lr=-1", "train.lr=-1.0: use a learning rate > 0"),        # before any regeneration
    ("train.lr=abc", "train.lr: Value 'abc'"),
    ("+foo=1", "foo: unknown key"),
    ("experiment=nope", "Could not find 'experiment/nope'"),
    ("data.limit=0", "data.limit=0"),
    ("train.warmup_ratio=1.5", "train.warmup_ratio=1.5"),
    ("hardware.device=tpu", "hardware.device='tpu'"),
])
def test_distill_refuses_bad_config_before_any_work_and_writes_nothing(workdir, tmp_path, monkeypatch, capsys,
                                                                       override, match):
    out = tmp_path / "run"
    _refused(DISTILL, "experiment=tiny_cpu", f"output_dir={out}", override, monkeypatch=monkeypatch, capsys=capsys,
             match=match)
    assert not out.exists()
    assert list(workdir.iterdir()) == []


def _earlier_run(root: Path) -> Path:
    run = root / "earlier"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("train:\n  lr: 0.003\n")
    (run / ".hydra" / "overrides.yaml").write_text("- experiment=tiny_cpu\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    return run


@pytest.mark.parametrize("override, match", [("train.lr=0.01", "is not empty (metrics.jsonl); pass resume=true"),
                                             ("+train.lrr=1", "train.lrr: unknown key")])
def test_a_refused_rerun_leaves_the_earlier_run_byte_identical(workdir, tmp_path, monkeypatch, capsys,
                                                               override, match):
    run = _earlier_run(tmp_path)
    before = _snapshot(run)
    _refused(DISTILL, "experiment=tiny_cpu", f"output_dir={run}", override, monkeypatch=monkeypatch, capsys=capsys,
             match=match)
    assert _snapshot(run) == before
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("script, overrides, match", [
    (DISTILL, ["train.lr=1e-3,-1"], "train.lr=-1.0: use a learning rate > 0"),     # the second point
    (DISTILL, ["+train.lrr=1,2"], "train.lrr: unknown key"),
    (EVAL, ["temperature=0,-1"], "temperature"),
])
def test_a_refused_sweep_writes_nothing(workdir, tmp_path, monkeypatch, capsys, script, overrides, match):
    """Under -m every point is checked before Hydra creates the sweep directory."""
    out = tmp_path / "sweep"
    _refused(script, "-m", "experiment=tiny_cpu", f"output_dir={out}", *overrides, monkeypatch=monkeypatch,
             capsys=capsys, match=match)
    assert not out.exists()
    assert list(workdir.iterdir()) == []


def test_a_sweep_into_an_earlier_run_is_refused_and_leaves_it_byte_identical(workdir, tmp_path, monkeypatch,
                                                                             capsys):
    run = _earlier_run(tmp_path)
    before = _snapshot(run)
    _refused(DISTILL, "-m", "experiment=tiny_cpu", f"output_dir={run}", "train.lr=1e-3,3e-3", monkeypatch=monkeypatch,
             capsys=capsys, match="is not empty: a sweep there would write into an earlier run")
    assert _snapshot(run) == before
    assert list(workdir.iterdir()) == []


def test_every_process_of_a_launch_ignores_the_sweep_files_this_launch_wrote(tmp_path, monkeypatch):
    """Any process of a multi-process launch may create the sweep directory before another one
    checks it (process 0 too may be the slow one): each counts only entries older than the
    launcher, so this launch's files pass and an earlier run's still refuse."""
    import os
    import time

    import dflash2.entrypoint as entrypoint

    root = tmp_path / "sweep"
    root.mkdir()
    (root / "multirun.yaml").write_text("x")  # written by some process of this launch
    launched = time.time() - 60
    monkeypatch.setattr(entrypoint, "_launch_started", lambda: launched)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        assert not entrypoint._holds_an_earlier_run(root)
    old = root / "0"
    old.mkdir()
    os.utime(old, (launched - 3600, launched - 3600))  # a point directory of an earlier run
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        assert entrypoint._holds_an_earlier_run(root)
    old.rmdir()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert entrypoint._holds_an_earlier_run(root)  # one process counts every entry
    assert not entrypoint._holds_an_earlier_run(tmp_path / "missing")


def test_launch_started_is_the_parent_process_start():
    import psutil

    from dflash2.entrypoint import _launch_started

    assert _launch_started() == psutil.Process().parent().create_time() <= psutil.Process().create_time()


def test_sweep_points_expand_like_hydra():
    from dflash2.entrypoint import sweep_points

    points = sweep_points(["a=1,2", "b=x,y", "c=3", "hydra.sweep.dir=/tmp/x"])
    assert sorted(map(sorted, points)) == sorted(map(sorted, [["a=1", "b=x", "c=3"], ["a=1", "b=y", "c=3"],
                                                             ["a=2", "b=x", "c=3"], ["a=2", "b=y", "c=3"]]))


def test_debug_flag_adds_the_traceback(workdir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DFLASH2_DEBUG", "1")
    status, _, err = _run(DISTILL, "experiment=tiny_cpu", f"output_dir={tmp_path / 'run'}", "train.lr=-1",
                          monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2
    assert "Traceback (most recent call last)" in err and "ValueError" in err
    assert err.strip().splitlines()[-1] == "error: train.lr=-1.0: use a learning rate > 0"


def test_data_too_small_for_one_batch_is_one_error_line(workdir, tmp_path, monkeypatch, capsys):
    """Known only once the data is regenerated and packed, but still the user's to fix: one `error:`
    line (after the regeneration's progress bar), status 2, no traceback."""
    status, _, err = _run(DISTILL, "experiment=tiny_cpu", f"output_dir={tmp_path / 'run'}", "train.batch_size=4096",
                          monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and "fewer than train.batch_size=4096" in last, last
    answers = tmp_path / "run" / "data" / "regenerated.jsonl"
    kept = answers.read_bytes()
    assert "resume=true" in last and kept  # the regenerated answers stay, as the message says
    status, _, err = _run(DISTILL, "experiment=tiny_cpu", f"output_dir={tmp_path / 'run'}", "train.batch_size=4",
                          "train.max_steps=1", "resume=true", monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    assert answers.read_bytes() == kept  # reused, not regenerated again


@pytest.mark.parametrize("override, match", [("+arms.extra=1", "arms.extra: unknown key"),
                                             ("max_new_tokens=0", "max_new_tokens=0: must be >= 1"),
                                             ("draft_path=/nonexistent/ckpt", "draft_path=/nonexistent/ckpt"),
                                             ("logger.mode=cloud", "logger.mode='cloud'")])
def test_eval_refuses_bad_config_and_writes_nothing(workdir, tmp_path, monkeypatch, capsys, override, match):
    out = tmp_path / "run"
    _refused(EVAL, "experiment=tiny_cpu", f"output_dir={out}", override, monkeypatch=monkeypatch, capsys=capsys,
             match=match)
    assert not out.exists() and list(workdir.iterdir()) == []
    run = _earlier_run(tmp_path)
    before = _snapshot(run)
    _refused(EVAL, "experiment=tiny_cpu", f"output_dir={run}", monkeypatch=monkeypatch, capsys=capsys,
             match="is not empty")
    assert _snapshot(run) == before


def test_a_failed_eval_check_writes_the_run_then_exits_in_one_line_with_status_3(workdir, tmp_path, monkeypatch,
                                                                                 capsys):
    out = tmp_path / "run"
    status, _, err = _run(EVAL, "experiment=tiny_cpu", f"output_dir={out}", "data.datasets=[gsm8k]", "data.limit=1",
                          "max_new_tokens=4", "stats.n_resamples=20", "arms.selector_off=false",
                          "checks.oracle_min_accepted=2.5", "checks.draft_min_accepted=2.0",
                          monkeypatch=monkeypatch, capsys=capsys)
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("samples x arms:")]  # progress bar
    assert status == 3, err
    assert len(lines) == 1 and lines[0].startswith("error: evaluation checks failed: "), err   # no traceback
    assert "oracle_min_accepted: mean accepted drafts per step must be >= 2.5; measured oracle@N=3 " in lines[0]
    assert "draft_min_accepted: mean accepted drafts per step must be >= 2; measured dflash2@N=3 " in lines[0]
    assert "identical_to_ar" not in lines[0] and lines[0].endswith(f"are in {out}")
    summary = json.loads((out / "summary.json").read_text())   # everything was written first
    assert summary["checks"]["oracle_min_accepted"]["passed"] is False
    assert summary["checks"]["identical_to_ar"]["passed"] is True
    assert (out / "records.jsonl").is_file() and (out / "report.html").is_file()


def test_failed_checks_line_names_each_failure_and_skips_what_passed():
    from dflash2.evaluation.running.runner import failed_checks_line

    checks = {"oracle_mean_accepted_per_step": {"oracle@3": 0.5},
              "oracle_min_accepted": {"threshold": 1.0, "passed": False, "not_checked": [],
                                      "measured": {"oracle@3": 0.5}},
              "draft_min_accepted": {"threshold": 3.0, "passed": False, "not_checked": ["spec@1", "spec@3"],
                                     "measured": {"spec@1": 0.4, "spec@3": 1.1}},
              "identical_to_ar": {"records": 8, "differing": ["spec@3:g/0", "spec@3:g/1", "spec@7:g/0", "spec@7:g/1"],
                                  "n_differing": 4, "passed": False}}
    line = failed_checks_line(checks)
    assert line == ("oracle_min_accepted: mean accepted drafts per step must be >= 1; measured oracle@3 0.50; "
                    "draft_min_accepted: mean accepted drafts per step must be >= 3; measured no arm drafts more "
                    "than 3 tokens; identical_to_ar: 4 of 8 speculative records differ from the AR arm "
                    "(spec@3:g/0, spec@3:g/1, spec@7:g/0 ...)")
    for key in ("oracle_min_accepted", "draft_min_accepted", "identical_to_ar"):
        checks[key]["passed"] = True
    assert failed_checks_line(checks) is None


def test_regenerate_refuses_bad_config_and_writes_nothing(workdir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    for override, match in [("data.limit=0", "data.limit=0"), ("+data.limitt=3", "data.limitt: unknown key"),
                            ("data=jsonl", "data.source=jsonl needs data.path")]:
        _refused(REGENERATE, "target=tiny-qwen3", "hardware=cpu", f"output_dir={out}", override,
                 monkeypatch=monkeypatch, capsys=capsys, match=match)
    assert not out.exists() and list(workdir.iterdir()) == []


def test_unknown_keys_walks_typed_nodes_only():
    from omegaconf import OmegaConf

    from dflash2.training.config import DistillConfig

    cfg = OmegaConf.structured(DistillConfig)
    assert unknown_keys(cfg) == []
    OmegaConf.update(cfg, "train.lrr", 1, force_add=True)           # what Hydra's +train.lrr=1 does
    OmegaConf.update(cfg, "extra", {"a": 1}, force_add=True)
    found = dict(unknown_keys(cfg))
    assert set(found) == {"train.lrr", "extra"} and "lr" in found["train.lrr"]


# ---------------------------------------------------------------------------------- summaries
def test_distill_summary_reports_losses_heldout_tau_and_paths(tmp_path):
    from dflash2.training.run import distill_summary
    from tests.training.distill_helpers import run

    torch.set_num_threads(1)
    out = tmp_path / "run"
    run(out, max_steps=3, checkpoint_every=2, eval_max_new_tokens=4)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last, held = [r for r in rows if "loss" in r][-1], [r for r in rows if "eval/tau_real" in r][-1]
    text = distill_summary(out)
    assert f"step 3: loss {last['loss']:.4g}, tau_proxy {last['tau_proxy']:.4g}" in text
    assert f"held-out at step 3: engine tau {held['eval/tau_real']:.4g}" in text
    assert f"checkpoint: {out / 'checkpoints' / 'step_3'}" in text
    assert f"export:     {out / 'final'}" in text and f"metrics:    {out / 'metrics.jsonl'}" in text


def test_eval_summary_reads_summary_json(tmp_path):
    namespace = runpy.run_path(str(EVAL), run_name="eval_run")
    overall = {"ar": {"n": 4, "tau_pooled": 1.0, "accuracy": 0.5, "n_scored": 2},
               "dflash2@N=3": {"n": 4, "tau_pooled": 2.25, "identical_fraction": 0.75, "accuracy": 0.5,
                               "n_scored": 2}}
    summary = {"n_samples": 4, "datasets": ["gsm8k", "mt_bench"], "arms": list(overall),
               "per_arm": {a: {"overall": o} for a, o in overall.items()}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    text = namespace["eval_summary"](tmp_path)
    assert "4 samples (gsm8k, mt_bench)" in text
    dflash_line = next(line for line in text.splitlines() if "dflash2@N=3" in line)
    assert "tau 2.250" in dflash_line and "identical to AR 3/4" in dflash_line and "accuracy 0.500" in dflash_line
    assert f"report:  {tmp_path / 'report.html'}" in text


def test_resume_message_names_the_checkpoint_or_its_absence(tmp_path):
    from dflash2.training.trainer import resume_message

    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_4.tmp").mkdir(parents=True)
    (ckpts / "step_6").mkdir()
    (ckpts / "step_6" / "config.json").write_text("{}")          # no trainer state, no COMPLETE marker
    text = resume_message(tmp_path, None)
    assert f"skipped {ckpts / 'step_4.tmp'} (an interrupted write" in text
    assert f"skipped {ckpts / 'step_6'} (incomplete (no COMPLETE, trainer_state.pt))" in text
    assert text.endswith(f"no usable checkpoint in {ckpts}: starting at step 0")
    assert resume_message(tmp_path, ckpts / "step_2").endswith(f"continuing from step 2 ({ckpts / 'step_2'})")


def test_entry_scripts_do_not_edit_sys_path():
    """The package is installed (`make install`): the entry scripts import it like any user code."""
    scripts = sorted((ROOT / "train").glob("*.py")) + sorted((ROOT / "eval").glob("*.py"))
    assert scripts and [p.name for p in scripts if "sys.path" in p.read_text()] == []


def test_resume_note_counts_the_rows_kept(tmp_path):
    from dflash2.entrypoint import resume_note
    from dflash2.jsonl import append_jsonl

    assert resume_note("eval", tmp_path, ("records.jsonl",)) == (
        f"[eval] resume: nothing to resume in {tmp_path}: starting from the beginning")
    append_jsonl(tmp_path / "records.jsonl", [{"a": 1}, {"a": 2}])
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "records.rank1.jsonl").write_text('{"a": 3}\n{"a": ')   # a torn last line
    assert resume_note("eval", tmp_path, ("records.jsonl", "shards/*.jsonl")) == (
        f"[eval] resume: continuing after 2 rows in {tmp_path / 'records.jsonl'}, "
        f"1 rows in {tmp_path / 'shards' / 'records.rank1.jsonl'}")


def test_kill_hook_is_off_unless_armed_and_refuses_a_malformed_value():
    from dflash2 import killpoints

    try:
        assert killpoints.arm_from_env({}) is None
        killpoints.reached("metrics_write", 1)                               # unarmed: returns
        assert killpoints.arm_from_env({"DFLASH2_KILL_AT": "checkpoint_save@4"}) == ("checkpoint_save", 4)
        killpoints.reached("checkpoint_save", 3)                             # another step: returns
        killpoints.reached("metrics_write", 4)                               # another point: returns
        for bad in ("bogus", "checkpoint_save", "metrics_write@x", "elsewhere@2"):
            with pytest.raises(ValueError, match="DFLASH2_KILL_AT"):
                killpoints.arm_from_env({"DFLASH2_KILL_AT": bad})
    finally:
        killpoints.arm_from_env({})


def test_the_recorded_config_is_kept_beside_results_and_replaced_without_them(tmp_path):
    """A resumed run keeps the record of the run it continues; a directory that a run left without
    results (it failed before any work) takes the corrected rerun's record."""
    from omegaconf import OmegaConf

    from dflash2.entrypoint import write_run_config

    run = _earlier_run(tmp_path)
    assert write_run_config(run, OmegaConf.create({"train": {"lr": 0.01}}), job_name="distill") is None
    assert (run / ".hydra" / "config.yaml").read_text() == "train:\n  lr: 0.003\n"
    (run / "metrics.jsonl").unlink()
    (run / "distill.log").write_text("")                                  # the job's log is not a result
    path = write_run_config(run, OmegaConf.create({"train": {"lr": 0.01}}), job_name="distill")
    assert path == run / ".hydra" / "config.yaml" and path.read_text() == "train:\n  lr: 0.01\n"
