"""The ablation from its one command (`python -m dflash2.ablation --plan tiny_cpu ROOT`,
docs/EXPERIMENTS.md) at toy scale on a CPU: one regeneration, the three arms trained in one
process, every (arm, T) evaluated, the N sweep, a timing run, `eval/report.py --compare`; the
comparison must hold the three drafters with the numbers of their runs' records, and a rerun
continues what did not finish."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("dflash2", "conv_only", "v1")


def _pooled_tau(records: list[dict], arm: str) -> float:
    acc = [a for r in records if r["arm"] == arm for a in r["accepted"]]
    return (sum(acc) + len(acc)) / len(acc)


def _launch(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "dflash2.ablation", "--plan", "tiny_cpu", str(root), "--no-progress",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_the_ablation_runs_from_its_one_command_and_resumes(tmp_path):
    abl = tmp_path / "ablation"
    proc = _launch(abl)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((abl / "ablation.json").read_text())
    assert list(state["phases"]) == ["regen", "train", "eval", "speed", "compare"]
    assert state["phases"]["eval"]["jobs"] == [f"eval_{a}_T0" for a in ARMS] + ["sweep_dflash2"]
    for phase in state["phases"]:
        assert f"| {phase} |" in proc.stdout                  # the table of wall minutes per phase
    # The three arms trained in one process: one training job, one log, every arm's export.
    train_log = (abl / "logs" / "train.log").read_text()
    assert train_log.count("\n$ ") == 1 and all(f"[{a}] distillation finished" in train_log for a in ARMS)
    speed = [json.loads(line) for line in (abl / "speed" / "b1" / "records.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in speed} == {"ar", "dflash2@N=1", "dflash2@N=3"}

    # A rerun with everything done starts no job; a job marked unfinished reruns with resume=true.
    again = _launch(abl)
    assert again.returncode == 0 and again.stdout == proc.stdout
    state["jobs"]["eval_v1_T0"]["done"] = False
    del state["phases"]["eval"], state["phases"]["compare"], state["jobs"]["compare"]
    (abl / "ablation.json").write_text(json.dumps(state))
    resumed = _launch(abl, "--phases", "eval,compare")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = (abl / "logs" / "eval_v1_T0.log").read_text()
    assert log.count("\n$ ") == 2 and log.split("\n$ ")[-1].splitlines()[0].endswith("resume=true")
    assert (abl / "logs" / "eval_dflash2_T0.log").read_text().count("\n$ ") == 1   # finished: not rerun
    bad = _launch(tmp_path / "other", "--phases", "eval,trian")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --phases: unknown trian")
    assert not (tmp_path / "other").exists()

    # Each arm trained what it names, from the one regeneration.
    archs = {a: json.loads((abl / "train" / a / "final" / "config.json").read_text())["architectures"] for a in ARMS}
    assert archs == {"dflash2": ["DFlash2DraftModel"], "conv_only": ["DFlash2DraftModel"], "v1": ["DFlashDraftModel"]}
    conv = [json.loads(line) for line in (abl / "train" / "conv_only" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss_unary"] for r in conv if "loss" in r)  # selector weight 0
    records = {a: [json.loads(line) for line in (abl / "eval" / f"{a}_T0" / "records.jsonl").read_text().splitlines()]
               for a in ARMS}
    for a, recs in records.items():
        assert {Path(r["draft_path"]).resolve() for r in recs if r["arm_kind"] != "ar"} == \
            {(abl / "train" / a / "final").resolve()}
        assert all(r["identical_to_ar"] for r in recs if r["arm_kind"] != "ar")  # fp32, T = 0: lossless
    assert any(r["arm_kind"] == "selector_off" for r in records["dflash2"])
    assert not any(r["arm_kind"] == "selector_off" for a in ("conv_only", "v1") for r in records[a])

    res = json.loads((abl / "compare" / "compare.json").read_text())
    assert res["n"] == 3
    top = {a["drafter"]: a for a in res["arms"] if a["kind"] == "spec" and a["dataset"] == "all" and a["T"] == 0}
    assert list(top) == list(ARMS)
    for a in ARMS:
        assert abs(top[a]["tau_pooled"] - _pooled_tau(records[a], "dflash2@N=3")) < 1e-12
        assert top[a]["n"] == 2
    ratio = next(r for r in res["ratios"] if r["name"] == "dflash2 / v1" and r["T"] == 0)
    assert ratio["n"] == 2
    assert abs(ratio["ratio"] - _pooled_tau(records["dflash2"], "dflash2@N=3")
               / _pooled_tau(records["v1"], "dflash2@N=3")) < 1e-12
    assert {(p["drafter"], p["N"]) for p in res["sweep"]} == ({(a, n) for a in ARMS for n in (1, 3)}
                                                              | {("dflash2", 2)})   # + the N sweep's N = 2
    assert set(res["training"]) == set(ARMS) and {c["drafter"] for c in res["checkpoints"]} == set(ARMS)
    md = (abl / "compare" / "compare.md").read_text()
    for name in ("tau", "tau_ratio", "per_position", "sweep", "training"):
        with Image.open(abl / "compare" / "figures" / f"{name}.png") as im:
            assert im.format == "PNG"
        assert f"](figures/{name}.png)" in md
    assert all(f"| {a} | 0 | all | 2 |" in md for a in ARMS)
    assert "McNemar b / c" in md and all(r["mcnemar_b"] is not None for r in res["arms"] if r["dataset"] == "gsm8k")
