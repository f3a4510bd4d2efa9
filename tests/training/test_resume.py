"""Crash safety of distillation with real kills: a tiny run is SIGKILLed during its first
checkpoint save, during a metrics write and at a random moment, resumed after each, and ends with
the uninterrupted run's per-step losses and final weights, bit for bit; nothing an earlier run
wrote is lost, and each resume says what it continued from.

The named kill points use the explicit test hook `DFLASH2_KILL_AT` (`dflash2.killpoints`); the
steps they hit are drawn from a seeded generator, so every run of the test kills at the same
places."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash2.jsonl import read_jsonl
from dflash2.training.state import list_checkpoints

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 12, 2  # steps past the kill point leave the poller time to kill a resumed run
ARGS = [f"max_steps={STEPS}", f"checkpoint_every={EVERY}", "keep_checkpoints=0", "eval_max_new_tokens=0"]


def _launch(out: Path, log: Path, *extra: str, kill_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("DFLASH2_KILL_AT", None)
    if kill_at:
        env["DFLASH2_KILL_AT"] = kill_at
    fh = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "tests.training.distill_helpers", str(out), *ARGS, *extra],
                            cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen, log: Path, want: int) -> str:
    rc = proc.wait(timeout=300)
    text = log.read_text()
    assert rc == want, f"exit {rc}, wanted {want}:\n{text[-3000:]}"
    return text


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return read_jsonl(path) if path.is_file() else []


def _losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in _rows(out) if "loss" in r]


def _checkpoint_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: (p / "trainer_state.pt").read_bytes() + (p / "model.safetensors").read_bytes()
            for p in list_checkpoints(out)}


def _resumed_rows(out: Path, step: int) -> list[dict]:
    """The rows a resume from `step` must keep exactly (the torn last line, if any, is not a row)."""
    return [r for r in _rows(out) if r["step"] <= step]


@pytest.mark.filterwarnings("ignore::dflash2.jsonl.TornLineWarning")   # reading the killed run's torn line is expected
def test_killed_at_checkpoint_save_metrics_write_and_random_then_resumed(tmp_path):
    rng = random.Random(24)
    metrics_kill = rng.choice([3, 5])                 # a step past the first complete checkpoint
    full, run = tmp_path / "full", tmp_path / "killed"
    logs = iter(tmp_path / f"log{i}.txt" for i in range(10))
    ref_log = next(logs)
    ref = _launch(full, ref_log)

    # 1. SIGKILL inside the first checkpoint save: only a torn step_2.tmp exists.
    log = next(logs)
    _finish(_launch(run, log, kill_at=f"checkpoint_save@{EVERY}"), log, -signal.SIGKILL)
    assert list_checkpoints(run) == [] and (run / "checkpoints" / f"step_{EVERY}.tmp").is_dir()

    # 2. Resume: no usable checkpoint, said so (naming the torn one); killed mid-write of a metrics row.
    log = next(logs)
    text = _finish(_launch(run, log, "resume=true", kill_at=f"metrics_write@{metrics_kill}"), log, -signal.SIGKILL)
    assert f"resume: skipped {run / 'checkpoints' / f'step_{EVERY}.tmp'}" in text
    assert f"resume: no usable checkpoint in {run / 'checkpoints'}: starting at step 0" in text
    assert not (run / "metrics.jsonl").read_text().endswith("\n")           # a torn last line
    resume_at = (metrics_kill - 1) // EVERY * EVERY
    kept, ckpts = _resumed_rows(run, resume_at), _checkpoint_bytes(run)
    assert sorted(ckpts) == [f"step_{s}" for s in range(EVERY, resume_at + 1, EVERY)]

    # 3. Resume from the last checkpoint (the torn row is dropped with a warning); SIGKILL at a
    #    random moment once a newer checkpoint exists and training went past it.
    log = next(logs)
    victim = _launch(run, log, "resume=true")
    deadline = time.time() + 240
    while time.time() < deadline:
        done = list_checkpoints(run)
        rows = _losses(run)
        newest = int(done[-1].name.split("_")[1]) if done else 0
        if newest > resume_at and rows and rows[-1][0] > newest:
            break
        assert victim.poll() is None, log.read_text()[-3000:]
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    text = _finish(victim, log, -signal.SIGKILL)
    assert f"resume: continuing from step {resume_at} ({run / 'checkpoints' / f'step_{resume_at}'})" in text
    assert "TornLineWarning" in text and "metrics.jsonl" in text
    assert not (run / "final").exists(), "the run finished before it could be killed"
    assert _resumed_rows(run, resume_at) == kept                            # rows up to the resume kept
    assert all(_checkpoint_bytes(run)[k] == v for k, v in ckpts.items())    # earlier checkpoints untouched
    resume_at, kept, ckpts = newest, _resumed_rows(run, newest), _checkpoint_bytes(run)

    # 4. Resume to the end.
    log = next(logs)
    text = _finish(_launch(run, log, "resume=true"), log, 0)
    assert f"resume: continuing from step {resume_at}" in text
    _finish(ref, ref_log, 0)
    want, got = _losses(full), _losses(run)
    assert [s for s, _ in got] == list(range(1, STEPS + 1))                 # one row per step, none repeated
    assert got == want                                                      # bit-identical (float repr equality)
    assert _resumed_rows(run, resume_at) == kept
    assert all(_checkpoint_bytes(run)[k] == v for k, v in ckpts.items())
    assert (run / "final" / "model.safetensors").read_bytes() == (full / "final" / "model.safetensors").read_bytes()
