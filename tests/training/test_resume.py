"""A run killed mid-way (real SIGKILL) and resumed gives the uninterrupted run's losses, bit for bit."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dflash2.training.metrics import read_metrics
from dflash2.training.state import list_checkpoints

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["max_steps=8", "checkpoint_every=2", "eval_max_new_tokens=0"]


def _launch(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.training.distill_helpers", str(out), *ARGS, *extra],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


def test_sigkill_then_resume_continues_the_same_loss_curve(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    ref = _launch(full)
    victim = _launch(killed)
    deadline = time.time() + 240
    while time.time() < deadline:       # kill once a checkpoint exists and training went past it
        ckpts = list_checkpoints(killed)
        rows = _losses(killed) if (killed / "metrics.jsonl").is_file() else []
        if ckpts and rows and rows[-1][0] > int(ckpts[-1].name.split("_")[1]):
            break
        assert victim.poll() is None, victim.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (killed / "final").exists(), "the run finished before it could be killed"
    resumed = _launch(killed, "resume=true")
    assert resumed.wait(timeout=240) == 0, resumed.stderr.read().decode()[-2000:]
    assert ref.wait(timeout=240) == 0, ref.stderr.read().decode()[-2000:]
    want, got = _losses(full), _losses(killed)
    assert [s for s, _ in got] == list(range(1, 9))            # one row per step, none repeated
    assert got == want                                         # bit-identical (float repr equality)
    assert (killed / "final" / "model.safetensors").read_bytes() == (full / "final" / "model.safetensors").read_bytes()
