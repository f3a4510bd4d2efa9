"""FSDP2 on CPU (two gloo processes): the same losses as one process at the same global batch, and
checkpoints that move between FSDP and one process in both directions.

One launch covers both directions: the FSDP run resumes from a checkpoint a 1-process run wrote
(steps 3..6 must match that run), and writes its own checkpoints, one of which a 1-process run
then resumes (steps 5..6 must match again). Gradient accumulation (FSDP's no-sync) and per-layer
activation checkpointing are on in the FSDP run.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash2.checkpoint import read_tensors
from dflash2.training.metrics import read_metrics
from dflash2.training.state import checkpoint_dir, load_state, optimizer_state_by_index, optimizer_state_by_name
from tests.training.multi_helpers import run

ROOT = Path(__file__).resolve().parents[2]
ARGS = dict(max_steps=6, checkpoint_every=2, keep_checkpoints=3, grad_accum=2, eval_max_new_tokens=4)
KEYS = ("loss", "loss_unary", "loss_selector", "recall_at_k", "tau_proxy", "slots", "grad_norm")


def launch_two(out: Path, *args: str) -> str:
    """Two CPU processes through `accelerate launch` with the shipped FSDP config (gloo; bf16
    overridden: fp32 on CPU); returns their stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("ACCELERATE_USE_FSDP", None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / "fsdp_2gpu.yaml"), "--mixed_precision", "no",
           "--dynamo_backend", "no", "-m", "tests.training.multi_helpers", str(out), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def copy_checkpoint(src: Path, step: int, dst: Path) -> None:
    shutil.copytree(checkpoint_dir(src, step), checkpoint_dir(dst, step))


def rows(out: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


def assert_rows_match(got: dict, want: dict, steps) -> None:
    assert sorted(got) == list(steps)
    for s in steps:
        for key in KEYS:
            assert got[s][key] == pytest.approx(want[s][key], rel=1e-5, abs=1e-6), (s, key)


def test_optimizer_state_round_trip_by_name_and_index():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    names = [n for n, _ in model.named_parameters()]
    indexed = opt.state_dict()
    named = optimizer_state_by_name(indexed, names)
    assert list(named["state"]) == names and named["param_groups"][0]["params"] == names
    back = optimizer_state_by_index(named)
    assert back["param_groups"] == indexed["param_groups"]
    assert back["state"].keys() == indexed["state"].keys()
    for i, s in indexed["state"].items():
        for k, v in s.items():
            assert torch.equal(back["state"][i][k], v)
    with pytest.raises(ValueError, match="holds 4 parameters but this run trains 3"):
        optimizer_state_by_name(indexed, names[:3])


@pytest.mark.parametrize("want, launched, world, mode", [
    ("auto", False, 1, "single"), ("auto", False, 2, "ddp"), ("auto", True, 2, "fsdp"), ("fsdp", False, 2, "fsdp"),
    ("ddp", False, 2, "ddp"), ("fsdp", False, 1, "single"),
])
def test_distributed_mode(monkeypatch, want, launched, world, mode):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from dflash2.runconfig import HardwareSpec
    from dflash2.training.distributed import distributed_mode

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    if launched:
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    acc = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU if world > 1 else DistributedType.NO,
                          num_processes=world)
    if want == "fsdp" and world == 1:
        with pytest.warns(UserWarning, match="nothing to shard"):
            assert distributed_mode(HardwareSpec(distributed=want), acc) == mode
    else:
        assert distributed_mode(HardwareSpec(distributed=want), acc) == mode


def test_distributed_mode_refuses_conflicts(monkeypatch):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from dflash2.runconfig import HardwareSpec
    from dflash2.training.distributed import distributed_mode

    acc = SimpleNamespace(distributed_type=DistributedType.FSDP, num_processes=2)
    with pytest.raises(ValueError, match="hardware.distributed=ddp, but accelerate was launched with an FSDP"):
        distributed_mode(HardwareSpec(distributed="ddp"), acc)
    with pytest.raises(ValueError, match="hardware.distributed='zero3': use auto, ddp or fsdp"):
        distributed_mode(HardwareSpec(distributed="zero3"), acc)


def test_fsdp_two_processes_match_one_and_checkpoints_move_both_ways(tmp_path):
    one, fsdp, back = tmp_path / "one", tmp_path / "fsdp", tmp_path / "back"
    run(one, **ARGS)                                                  # reference: 1 process, 6 steps
    ref = rows(one)

    copy_checkpoint(one, 2, fsdp)                                     # 1 process -> FSDP
    out = launch_two(fsdp, "resume=true", "distributed=auto", "gradient_checkpointing=1",
                     *(f"{k}={v}" for k, v in ARGS.items()))
    assert "rank 0 of 2: fsdp" in out and "rank 1 of 2: fsdp" in out, out
    assert_rows_match(rows(fsdp), ref, range(3, 7))
    evals = [r for r in read_metrics(fsdp / "metrics.jsonl") if "eval/tau_real" in r]
    want = [r for r in read_metrics(one / "metrics.jsonl") if "eval/tau_real" in r]
    assert evals and evals[-1]["eval/tau_real"] == want[-1]["eval/tau_real"]   # gathered draft, same tokens
    assert evals[-1]["eval/tau_proxy"] == pytest.approx(want[-1]["eval/tau_proxy"], rel=1e-5)

    # The FSDP checkpoint holds the full state in the 1-process format.
    a, b = load_state(checkpoint_dir(one, 4)), load_state(checkpoint_dir(fsdp, 4))
    assert b["optimizer"]["param_groups"] == a["optimizer"]["param_groups"]
    assert b["optimizer"]["state"].keys() == a["optimizer"]["state"].keys()
    for i, s in a["optimizer"]["state"].items():
        for k, v in s.items():
            assert b["optimizer"]["state"][i][k].shape == v.shape, (i, k)
            assert torch.allclose(b["optimizer"]["state"][i][k], v, rtol=1e-4, atol=1e-6), (i, k)
    for path in (checkpoint_dir(fsdp, 4), fsdp / "final"):
        ref_path = checkpoint_dir(one, 4) if path.name == "step_4" else one / "final"
        got, exp = read_tensors(path), read_tensors(ref_path)
        assert got.keys() == exp.keys()
        for k in exp:
            assert got[k].dtype == exp[k].dtype and torch.allclose(got[k], exp[k], rtol=1e-4, atol=1e-5), (path, k)

    copy_checkpoint(fsdp, 4, back)                                    # FSDP -> 1 process
    run(back, resume=True, **ARGS)
    assert_rows_match(rows(back), ref, range(5, 7))
