"""The ablation launcher on several GPUs (`plan.gpus`, `--gpus`), on a CPU:

- with fake jobs (each subprocess replaced by a stub that records its `CUDA_VISIBLE_DEVICES` and
  when it ran): every job's GPU as `dflash2.placement` places it, recorded in `ROOT/ablation.json`
  and the logs; at most `parallel` evaluations per GPU, each timing run alone on its GPU; with
  gpus=1 nothing of the environment or the state changes;
- with the real tiny plan: `--gpus 2` trains the arms in two processes and writes the same
  `ROOT/train/<arm>/` as gpus=1's one process (same files, same weights and optimizer state, same
  metrics but timings), and a rerun resumes per process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash2 import ablation
from dflash2.ablation import Ablation, SpeedRun, load_plan
from dflash2.placement import schedule

ARMS = ("dflash2", "conv_only", "v1")
# Stands in for every job: records (job argv, CUDA_VISIBLE_DEVICES, start, end), sleeps a little.
STUB = """import json, os, sys, time
t0 = time.time(); time.sleep(0.4)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "start": t0, "end": time.time()}) + "\\n")
"""


def _fake_popen(monkeypatch, calls: Path):
    real = subprocess.Popen

    def popen(argv, **kw):
        return real([sys.executable, "-c", STUB, str(calls), *argv], **kw)

    monkeypatch.setattr(ablation.subprocess, "Popen", popen)


def _job_of(argv: list[str]) -> str:
    """The launcher's job name from a stub's recorded argv (its output_dir)."""
    out = Path(next(a for a in argv if a.startswith("output_dir=")).split("=", 1)[1])
    if "train/distill.py" in argv[1]:
        arms = next(a for a in argv if a.startswith("arms=["))[6:-1]
        return "train_" + arms.replace(",", "+")
    if out.parent.name in ("eval", "sweep", "speed"):
        return {"eval": "eval_", "sweep": "sweep_", "speed": "speed_"}[out.parent.name] + out.name
    return out.name


def _plan(gpus: int):
    plan = load_plan("tiny_cpu")
    plan.gpus, plan.temperatures, plan.parallel = gpus, [0.0, 1.0], 2       # 7 eval jobs, 2 per GPU
    plan.speed = [SpeedRun(name=f"b{i}") for i in (1, 2, 3)]
    return plan


def test_jobs_are_placed_on_gpus_recorded_and_pinned(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")      # the launcher's own devices: logical 0 -> 5, 1 -> 7
    calls = tmp_path / "calls.jsonl"
    _fake_popen(monkeypatch, calls)
    root = tmp_path / "abl"
    Ablation(_plan(2), root).run(list(ablation.PHASES), progress=False)

    state = json.loads((root / "ablation.json").read_text())
    runs = [json.loads(line) for line in calls.read_text().splitlines()]
    by_job = {}
    for r in runs:
        if "eval/report.py" in r["argv"][1]:
            by_job["compare"] = r
        else:
            by_job[_job_of(r["argv"])] = r
    assert state["phases"]["train"]["jobs"] == ["train_dflash2+conv_only", "train_v1"]
    assert set(by_job) == set(state["jobs"])
    device = {"0": "5", "1": "7"}
    for name, rec in state["jobs"].items():
        assert rec["done"]
        if name == "compare":
            assert "gpu" not in rec and by_job[name]["cvd"] == "5,7"      # no GPU: the environment as inherited
            continue
        assert rec["cuda_visible_devices"] == device[str(rec["gpu"])] == by_job[name]["cvd"]
        log = (root / "logs" / f"{name}.log").read_text()
        assert f"# gpu {rec['gpu']} (CUDA_VISIBLE_DEVICES={rec['cuda_visible_devices']})\n$ " in log
    gpu = {name: rec.get("gpu") for name, rec in state["jobs"].items()}
    assert gpu["regen"] == 0 and gpu["train_dflash2+conv_only"] == 0 and gpu["train_v1"] == 1
    # Each training group writes ROOT/train/<arm>/ through output_dir=ROOT/train, as the one process does.
    for name in ("train_dflash2+conv_only", "train_v1"):
        assert f"output_dir={root / 'train'}" in by_job[name]["argv"]
    # The first four evaluations start at once, round-robin; at most `parallel` (2) overlap per GPU.
    evals = [f"eval_{a}_T{t:g}" for a in ARMS for t in (0.0, 1.0)] + ["sweep_dflash2"]
    assert [gpu[n] for n in evals[:4]] == [0, 1, 0, 1]
    assert state["phases"]["eval"]["gpus"] == 2

    def overlap(names: list[str], g: int) -> int:
        spans = [(by_job[n]["start"], by_job[n]["end"]) for n in names if gpu[n] == g]
        return max(sum(s <= t < e for s, e in spans) for t, _ in spans) if spans else 0

    assert max(overlap(evals, g) for g in (0, 1)) == 2
    speeds = ["speed_b1", "speed_b2", "speed_b3"]
    assert {gpu[n] for n in speeds} == {0, 1} and max(overlap(speeds, g) for g in (0, 1)) == 1   # alone per GPU


def test_one_gpu_leaves_the_environment_and_the_state_as_before(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls = tmp_path / "calls.jsonl"
    _fake_popen(monkeypatch, calls)
    root = tmp_path / "abl"
    Ablation(_plan(1), root).run(["regen", "train", "speed"], progress=False)
    state = json.loads((root / "ablation.json").read_text())
    assert set(state["jobs"]) == {"regen", "train", "speed_b1", "speed_b2", "speed_b3"}
    assert all(set(rec) == {"done", "seconds"} for rec in state["jobs"].values())
    assert all("gpus" not in rec for rec in state["phases"].values())
    runs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert all(r["cvd"] is None for r in runs)
    assert not any("# gpu" in p.read_text() for p in (root / "logs").iterdir())
    starts = sorted((r["start"], r["end"]) for r in runs if "speed" in str(r["argv"]))
    assert all(a[1] <= b[0] for a, b in zip(starts, starts[1:]))           # timing runs one after another


def test_bad_gpus_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="gpus=0"):
        Ablation(_plan(0), tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ValueError, match="names 1 device"):
        Ablation(_plan(2), tmp_path)
    assert ablation.main([str(tmp_path / "x"), "--plan", "tiny_cpu", "--gpus", "0"]) == 2
    assert not (tmp_path / "x").exists()


def _files(arm_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(arm_dir)) for p in arm_dir.rglob("*") if p.is_file())


def _metrics(path: Path) -> list[dict]:
    timing = {"steps_per_s", "samples_per_s", "tokens_per_s", "peak_mem_gb"}
    return [{k: v for k, v in json.loads(line).items() if k not in timing} for line in path.read_text().splitlines()]


def _trainer_state(path: Path) -> dict:
    state = torch.load(path, weights_only=False)
    state["rng"] = state["rng"]["torch"]   # python / numpy RNG are never seeded: they differ run to run
    return state


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


def test_two_gpus_train_the_arms_in_two_processes_into_the_same_layout(tmp_path, monkeypatch):
    for k, v in {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    one, two = tmp_path / "one", tmp_path / "two"
    Ablation(load_plan("tiny_cpu"), one).run(["regen", "train"], progress=False)
    (two / "regen").parent.mkdir()
    shutil.copytree(one / "regen", two / "regen")          # the same regeneration for both
    plan = load_plan("tiny_cpu")
    plan.gpus = 2
    Ablation(plan, two).run(["train"], progress=False)

    state = json.loads((two / "ablation.json").read_text())
    assert state["phases"]["train"]["jobs"] == ["train_dflash2+conv_only", "train_v1"]
    assert [state["jobs"][j]["cuda_visible_devices"] for j in state["phases"]["train"]["jobs"]] == ["0", "1"]
    assert sorted(p.name for p in (two / "train").iterdir()) == sorted(ARMS)   # nothing else under train/
    logs = {j: (two / "logs" / f"{j}.log").read_text() for j in state["phases"]["train"]["jobs"]}
    assert all(f"[{a}] distillation finished" in logs["train_dflash2+conv_only"] for a in ("dflash2", "conv_only"))
    assert "[v1] distillation finished" in logs["train_v1"] and "[dflash2]" not in logs["train_v1"]
    for arm in ARMS:
        a, b = one / "train" / arm, two / "train" / arm
        assert _files(a) == _files(b), arm
        for rel in _files(a):
            if rel.endswith((".safetensors", ".json", "COMPLETE")):
                assert (a / rel).read_bytes() == (b / rel).read_bytes(), (arm, rel)   # weights bit for bit
        assert _metrics(a / "metrics.jsonl") == _metrics(b / "metrics.jsonl")
        ckpt = "checkpoints/step_2/trainer_state.pt"
        assert _same(_trainer_state(a / ckpt), _trainer_state(b / ckpt)), arm
        config = [(d / ".hydra" / "config.yaml").read_text().replace(str(root), "ROOT")
                  for d, root in ((a, one), (b, two))]
        assert config[0] == config[1], arm
        # .hydra/overrides.yaml records each process's command line: only its arms= differs.
        over = [(d / ".hydra" / "overrides.yaml").read_text().replace(str(root), "ROOT").splitlines()
                for d, root in ((a, one), (b, two))]
        assert [x for x in over[0] if "arms=" not in x] == [x for x in over[1] if "arms=" not in x]

    # Resumable per process: the v1 job marked unfinished reruns alone, with resume=true, and
    # leaves the finished arm as it was.
    before = (two / "train" / "v1" / "final" / "model.safetensors").read_bytes()
    state["jobs"]["train_v1"]["done"] = False
    (two / "ablation.json").write_text(json.dumps(state))
    Ablation(plan, two).run(["train"], progress=False)
    v1_log = (two / "logs" / "train_v1.log").read_text()
    assert v1_log.count("\n$ ") == 2 and v1_log.split("\n$ ")[-1].splitlines()[0].endswith("resume=true")
    assert (two / "logs" / "train_dflash2+conv_only.log").read_text().count("\n$ ") == 1
    assert (two / "train" / "v1" / "final" / "model.safetensors").read_bytes() == before


def test_the_15b_plan_is_the_05b_plan_with_its_target_on_four_gpus(tmp_path):
    from dataclasses import asdict

    small, large = asdict(load_plan("qwen05b")), asdict(load_plan("qwen15b"))
    assert small.pop("common") == ["target=qwen2.5-coder-0.5b", "target.dequantized_cache=true", "hardware=gpu"]
    assert large.pop("common") == ["target=qwen2.5-coder-1.5b", "target.dequantized_cache=true", "hardware=gpu"]
    assert (small.pop("name"), small.pop("gpus"), small.pop("parallel")) == ("qwen05b", 1, 7)
    assert (large.pop("name"), large.pop("gpus"), large.pop("parallel")) == ("qwen15b", 4, 2)
    assert small == large                   # data, arms, steps, evaluation, sweep, timing runs, resamples
    abl = Ablation(load_plan("qwen15b"), tmp_path)
    assert [(j.name, j.gpu) for j in abl.jobs("train")] == [("train_dflash2", 0), ("train_conv_only", 1),
                                                            ("train_v1", 2)]
    assert [j.gpu for j in abl.jobs("regen")] == [0]
    # The 7 evaluation jobs start together, 2 / 2 / 2 / 1 per GPU.
    assert schedule([1.0] * len(abl.jobs("eval")), 4, 2) == [0, 1, 2, 3, 0, 1, 2]
