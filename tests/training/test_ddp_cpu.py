"""Two CPU processes (accelerate, gloo) match one process at the same global batch, and a
checkpoint written by two processes resumes on one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2.training.metrics import read_metrics
from tests.training.distill_helpers import run

ROOT = Path(__file__).resolve().parents[2]


def test_two_processes_match_one(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # `--multi_gpu` (torchrun; gloo on CPU): `--cpu` alone starts ONE process without mpirun.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "tests.training.multi_helpers",
           str(tmp_path / "two"), "distributed=ddp", "max_steps=4", "checkpoint_every=2", "eval_max_new_tokens=0"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 of 2: ddp" in proc.stdout and "rank 1 of 2: ddp" in proc.stdout, proc.stdout
    run(tmp_path / "one", max_steps=4, checkpoint_every=2, eval_max_new_tokens=0)
    two = [r for r in read_metrics(tmp_path / "two" / "metrics.jsonl") if "loss" in r]
    one = [r for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    for a, b in zip(one, two):
        for key in ("loss", "loss_unary", "loss_selector", "recall_at_k", "tau_proxy", "slots"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
    # The 2-process checkpoint resumes on 1 process and lands where the 1-process run did.
    import shutil

    shutil.rmtree(tmp_path / "two" / "final")
    shutil.rmtree(tmp_path / "two" / "checkpoints" / "step_4")
    run(tmp_path / "two", resume=True, max_steps=4, checkpoint_every=2, eval_max_new_tokens=0)
    again = [r for r in read_metrics(tmp_path / "two" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in again] == [1, 2, 3, 4]
    assert again[3]["loss"] == pytest.approx(one[3]["loss"], rel=1e-5)
