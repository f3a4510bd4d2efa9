"""The ablation from its documented commands (docs/EXPERIMENTS.md), at toy scale on a CPU: one
regeneration, `train/distill.py -m` over the three arms, `eval/run.py -m` over their checkpoints,
`eval/report.py --compare`; the comparison must hold the three drafters with the numbers of
their runs' records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("dflash2", "conv_only", "v1")


def _run(root: Path, script: str, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / script), *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{script} {' '.join(args)}:\n{proc.stderr[-3000:]}"


def _pooled_tau(records: list[dict], arm: str) -> float:
    acc = [a for r in records if r["arm"] == arm for a in r["accepted"]]
    return (sum(acc) + len(acc)) / len(acc)


def test_the_ablation_runs_from_its_documented_commands(tmp_path):
    abl = tmp_path / "ablation"
    _run(tmp_path, "train/regenerate.py", "target=tiny-qwen3", "hardware=cpu", "data.limit=4",
         "data.max_new_tokens=8", f"output_dir={abl}/regen")
    _run(tmp_path, "train/distill.py", "-m", "experiment=ablation_tiny_cpu", "ablation_arm=" + ",".join(ARMS),
         f"output_dir={abl}/train")
    _run(tmp_path, "eval/run.py", "-m", "experiment=ablation_tiny_cpu", "ablation_arm=" + ",".join(ARMS),
         f"output_dir={abl}/eval")
    _run(tmp_path, "eval/report.py", "--compare", *(str(abl / "eval" / f"{a}_T0.0") for a in ARMS),
         "--out", str(abl / "compare"), "--n-resamples", "100")

    # Each arm trained what it names, from the one regeneration.
    archs = {a: json.loads((abl / "train" / a / "final" / "config.json").read_text())["architectures"] for a in ARMS}
    assert archs == {"dflash2": ["DFlash2DraftModel"], "conv_only": ["DFlash2DraftModel"], "v1": ["DFlashDraftModel"]}
    conv = [json.loads(line) for line in (abl / "train" / "conv_only" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss_unary"] for r in conv if "loss" in r)  # selector weight 0
    records = {a: [json.loads(line) for line in (abl / "eval" / f"{a}_T0.0" / "records.jsonl").read_text().splitlines()]
               for a in ARMS}
    for a, recs in records.items():
        assert {Path(r["draft_path"]).resolve() for r in recs if r["arm_kind"] != "ar"} == \
            {(abl / "train" / a / "final").resolve()}
        assert all(r["identical_to_ar"] for r in recs if r["arm_kind"] != "ar")  # fp32, T = 0: lossless
    assert any(r["arm_kind"] == "selector_off" for r in records["dflash2"])
    assert not any(r["arm_kind"] == "selector_off" for a in ("conv_only", "v1") for r in records[a])

    res = json.loads((abl / "compare" / "compare.json").read_text())
    assert res["n"] == 3
    top = {a["drafter"]: a for a in res["arms"] if a["kind"] == "spec" and a["dataset"] == "all"}
    assert list(top) == list(ARMS)
    for a in ARMS:
        assert abs(top[a]["tau_pooled"] - _pooled_tau(records[a], "dflash2@N=3")) < 1e-12
        assert top[a]["n"] == 2
    ratio = next(r for r in res["ratios"] if r["name"] == "dflash2 / v1")
    assert ratio["n"] == 2
    assert abs(ratio["ratio"] - _pooled_tau(records["dflash2"], "dflash2@N=3")
               / _pooled_tau(records["v1"], "dflash2@N=3")) < 1e-12
    assert {(p["drafter"], p["N"]) for p in res["sweep"]} == {(a, n) for a in ARMS for n in (1, 3)}
    assert set(res["training"]) == set(ARMS) and {c["drafter"] for c in res["checkpoints"]} == set(ARMS)
    md = (abl / "compare" / "compare.md").read_text()
    for name in ("tau", "tau_ratio", "per_position", "sweep", "training"):
        with Image.open(abl / "compare" / "figures" / f"{name}.png") as im:
            assert im.format == "PNG"
        assert f"](figures/{name}.png)" in md
    assert all(f"| {a} | 0 | all | 2 |" in md for a in ARMS)
