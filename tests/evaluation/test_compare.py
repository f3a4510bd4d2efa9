"""dflash2.evaluation.analysis.compare (eval/report.py --compare) on synthetic runs laid out as the ablation
presets write them: ROOT/train/<arm>/{metrics.jsonl,final/} and ROOT/eval/<arm>_T<t>/records.jsonl."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dflash2.evaluation.analysis import compare
from dflash2.evaluation.analysis.stats import summarize
from tests.evaluation.synthetic import synthetic_records

ALPHA = {"v1": 0.5, "conv_only": 0.65, "dflash2": 0.75}  # given in this order: tables must reorder
RESAMPLES = 200
ROOT = Path(__file__).resolve().parents[2]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _metrics(alpha: float) -> list[dict]:
    rows = [{"step": s, "loss": 5.0 * (1 - alpha) + 10.0 / s, "loss_unary": 1.0, "loss_selector": 0.5,
             "tau_proxy": 1 + alpha * s / 300, "path_tau": 1 + alpha} for s in range(50, 301, 50)]
    return rows + [{"step": 300, "eval/tau_proxy": 1 + alpha, "eval/tau_real": 1.5 + alpha}]


@pytest.fixture(scope="module")
def ablation(tmp_path_factory) -> tuple[Path, dict]:
    """Three arms at T=0 and T=1 (v1 ran 10 samples per dataset, the others 12: ratios must pair over
    the common ids), dflash2 with its selector-off arm, and a dflash2 N sweep with a cost model."""
    root = tmp_path_factory.mktemp("ablation")
    recs = {}
    for i, (arm, alpha) in enumerate(ALPHA.items()):
        final = root / "train" / arm / "final"
        final.mkdir(parents=True)
        (final / "model.safetensors").write_bytes(arm.encode() * 100)
        _write_jsonl(root / "train" / arm / "metrics.jsonl", _metrics(alpha))
        for t in (0.0, 1.0):
            r = synthetic_records(n_per_dataset=10 if arm == "v1" else 12, ns=(7,), alpha=alpha, temperature=t,
                                  seed=10 * i + int(t), selector_off=arm == "dflash2",
                                  flip={"dflash2@N=7": [0, 4]} if arm == "conv_only" else None)
            recs[arm, t] = [dict(x, draft_path=str(final) if x["arm_kind"] != "ar" else None) for x in r]
            _write_jsonl(root / "eval" / f"{arm}_T{t}" / "records.jsonl", recs[arm, t])
    sweep = [dict(r, draft_path=str(root / "train" / "dflash2" / "final"))
             for r in synthetic_records(n_per_dataset=8, ns=(1, 3, 7), alpha=0.7, seed=99) if r["dataset"] == "gsm8k"]
    _write_jsonl(root / "sweep" / "dflash2" / "records.jsonl", sweep)
    cost = {"arms": {f"dflash2@N={n}|T=0": {"predicted_speedup": 1.0 + n / 10} for n in (1, 3, 7)}}
    (root / "sweep" / "dflash2" / "summary.json").write_text(json.dumps({"cost_model": cost}))
    recs["sweep"] = sweep
    return root, recs


@pytest.fixture(scope="module")
def built(ablation, tmp_path_factory):
    root, _ = ablation
    runs = sorted(str(p) for p in (root / "eval").iterdir())
    return compare.compare_runs(runs, tmp_path_factory.mktemp("compare"), sweeps=[root / "sweep" / "dflash2"],
                                n_resamples=RESAMPLES)


def _pooled(recs: list[dict], arm: str, ids: set[str]) -> float:
    acc = [a for r in recs if r["arm"] == arm and r["sample_id"] in ids for a in r["accepted"]]
    return (sum(acc) + len(acc)) / len(acc)


def _ratio(res: dict, name: str, t: float) -> dict:
    return next(r for r in res["ratios"] if r["name"] == name and r["T"] == t)


def test_drafters_are_named_by_their_training_run_and_ordered(built):
    names = [(a["drafter"], a["kind"]) for a in built["arms"] if a["T"] == 0.0 and a["dataset"] == "all"]
    assert names == [("dflash2", "spec"), ("dflash2", "selector_off"), ("conv_only", "spec"), ("v1", "spec")]
    assert built["n"] == 7


def test_arm_numbers_are_recomputed_from_the_records(ablation, built):
    _, recs = ablation
    for (arm, t), r in ((k, v) for k, v in recs.items() if k != "sweep"):
        o = summarize(r, n_resamples=RESAMPLES)["per_arm"]["dflash2@N=7"]["overall"]
        row = next(a for a in built["arms"] if a["drafter"] == arm and a["T"] == t and a["kind"] == "spec"
                   and a["dataset"] == "all")
        assert row["tau_pooled"] == pytest.approx(o["tau_pooled"]) and row["n"] == o["n"]
        assert row["tau_pooled_ci"] == pytest.approx(o["tau_pooled_ci"])
        assert row["speedup"] == pytest.approx(o["speedup"])
    md = built["markdown"].read_text()
    conv = next(a for a in built["arms"] if a["drafter"] == "conv_only" and a["T"] == 0 and a["dataset"] == "all")
    assert conv["mcnemar_p"] is not None  # two flipped samples: discordant pairs
    assert f"| conv_only | 0 | all | 36 | {conv['tau_pooled']:.2f} [" in md


def test_dflash2_over_v1_ratio_pairs_the_common_samples(ablation, built):
    _, recs = ablation
    num, den = recs["dflash2", 0.0], recs["v1", 0.0]
    common = {r["sample_id"] for r in den}
    assert len(common) == 30 < len({r["sample_id"] for r in num})
    r = _ratio(built, "dflash2 / v1", 0.0)
    hand = _pooled(num, "dflash2@N=7", common) / _pooled(den, "dflash2@N=7", common)
    assert r["n"] == 30 and r["ratio"] == pytest.approx(hand, rel=1e-12)
    lo, hi = r["ratio_ci"]
    assert 1.0 < lo < hand < hi  # alpha 0.75 vs 0.5: clearly above 1
    assert {x["name"] for x in built["ratios"] if x["T"] == 1.0} == {
        "dflash2 / conv_only", "dflash2 / v1", "conv_only / v1", "dflash2 / dflash2, selector off"}
    assert f"| dflash2 / v1 | 0 | all | 30 | {r['tau_num']:.3f} | {r['tau_den']:.3f} | {hand:.3f} [" in \
        built["markdown"].read_text()
    # per dataset: the same ratio over that dataset's common samples only
    datasets = sorted({r["dataset"] for r in den})
    assert len(datasets) > 1
    for ds in datasets:
        ids = {r["sample_id"] for r in den if r["dataset"] == ds}
        row = next(x for x in built["ratios"] if x["name"] == "dflash2 / v1" and x["T"] == 0.0 and x["dataset"] == ds)
        assert row["n"] == len(ids) and row["ratio"] == pytest.approx(
            _pooled(num, "dflash2@N=7", ids) / _pooled(den, "dflash2@N=7", ids), rel=1e-12)


def test_ratio_ci_is_the_stats_bootstrap_when_the_denominator_is_constant(ablation):
    """Same scipy percentile bootstrap, same seed, same resampled sample ids as stats' pooled-tau CI."""
    _, recs = ablation
    num = {r["sample_id"]: r for r in recs["dflash2", 0.0] if r["arm"] == "dflash2@N=7"}
    den = {sid: dict(r, accepted=[1] * 4, steps=4) for sid, r in num.items()}  # tau 2 everywhere
    r = compare.tau_ratio(num, den, n_resamples=RESAMPLES, seed=0)
    s = summarize(recs["dflash2", 0.0], n_resamples=RESAMPLES)["per_arm"]["dflash2@N=7"]["overall"]
    assert r["ratio"] == pytest.approx(s["tau_pooled"] / 2)
    assert r["ratio_ci"] == pytest.approx((s["tau_pooled_ci"][0] / 2, s["tau_pooled_ci"][1] / 2), rel=1e-9)
    assert compare.tau_ratio(num, {}, 10)["ratio"] is None


def test_per_position_is_conditional(ablation, built):
    _, recs = ablation
    u = summarize(recs["dflash2", 0.0], n_resamples=RESAMPLES)["per_arm"]["dflash2@N=7"]["overall"][
        "per_position_acceptance"]
    p = next(x for x in built["positions"] if x["drafter"] == "dflash2" and x["T"] == 0 and x["kind"] == "spec")
    assert p["conditional"][0] == pytest.approx(u[0]) and p["conditional"][2] == pytest.approx(u[2] / u[1])
    assert np.allclose(p["conditional"][:3], ALPHA["dflash2"], atol=0.12)  # Bernoulli(alpha) until the first miss
    assert compare.conditional_acceptance([0.5, 0.25, 0.0, None]) == [0.5, 0.5, 0.0, None]


def test_sweep_reads_tau_from_records_and_predictions_from_the_summary(ablation, built):
    _, recs = ablation
    s = summarize(recs["sweep"], n_resamples=RESAMPLES)["per_arm"]
    pts = {p["N"]: p for p in built["sweep"]}
    assert sorted(pts) == [1, 3, 7]  # the compared runs have one N each: only the sweep run is a sweep
    for n, p in pts.items():
        assert p["drafter"] == "dflash2" and p["tau"] == pytest.approx(s[f"dflash2@N={n}"]["overall"]["tau_pooled"])
        assert p["predicted"] == pytest.approx(1.0 + n / 10)


def test_training_table_and_checkpoint_hashes(ablation, built):
    root, _ = ablation
    md = built["markdown"].read_text()
    assert f"| v1 | 300 | {5.0 * 0.5 + 10.0 / 300:.4f} |" in md
    sha = hashlib.sha256((root / "train" / "v1" / "final" / "model.safetensors").read_bytes()).hexdigest()
    assert {"drafter": "v1", "file": "model.safetensors", "sha256": sha} in built["checkpoints"]
    assert built["training"]["dflash2"]["rows"] == 7


def test_figures_are_pngs_and_every_drafter_keeps_one_colour(built):
    assert set(built["figures"]) == {"tau", "tau_ratio", "per_position", "sweep", "training"}
    md = built["markdown"].read_text()
    for path in built["figures"].values():
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] > 300
        assert f"](figures/{path.name})" in md
    assert built["colours"] == compare.drafter_colours(["dflash2", "conv_only", "v1"])
    a, b = compare.drafter_colours(["v1", "zeta", "alpha"]), compare.drafter_colours(["alpha", "zeta", "dflash2", "v1"])
    assert a["v1"] == b["v1"] == compare.KNOWN_COLOURS["v1"] and a["alpha"] == b["alpha"] and a["zeta"] == b["zeta"]
    assert len(set(b.values())) == 4


def test_names_duplicates_and_bad_runs_are_refused_with_the_run(ablation, tmp_path):
    root, _ = ablation
    run = root / "eval" / "v1_T0.0"
    assert compare.load_run(f"baseline={run}")[0].label == "baseline"
    with pytest.raises(ValueError, match="two runs of drafter 'v1' at T=0"):
        compare.compare_runs([run, run], tmp_path / "a", n_resamples=10)
    with pytest.raises(FileNotFoundError, match="nope.records.jsonl does not exist"):
        compare.compare_runs([root / "nope"], tmp_path / "b")
    with pytest.raises(ValueError, match="no compared run has a drafter arm at N=3"):
        compare.compare_runs([run], tmp_path / "c", n=3, n_resamples=10)
    _write_jsonl(tmp_path / "n3" / "records.jsonl", synthetic_records(n_per_dataset=2, ns=(3,)))
    with pytest.raises(ValueError, match="share no num_speculative_tokens"):
        compare.compare_runs([run, tmp_path / "n3"], tmp_path / "d", n_resamples=10)
    with pytest.raises(FileNotFoundError, match="--train .*nope: not a directory"):
        compare.compare_runs([run], tmp_path / "e", train=[f"x={root / 'nope'}"], n_resamples=10)
    assert not any((tmp_path / d).exists() for d in "abcde")  # nothing written by a refused run
    res = compare.compare_runs([f"baseline={run}"], tmp_path / "f", train=[f"baseline={root / 'train' / 'v1'}"],
                               n_resamples=10)
    assert res["training"] == {"baseline": {"dir": str(root / "train" / "v1"), "rows": 7}}
    assert {a["drafter"] for a in res["arms"]} == {"baseline"} and res["ratios"] == []


def test_cli_refuses_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "eval" / "report.py"), "--compare", str(tmp_path / "nope"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    missing = tmp_path / "nope" / "records.jsonl"
    assert proc.stderr.strip().splitlines() == [f"eval/report.py --compare: {missing} does not exist; "
                                                "pass a run directory that eval/run.py wrote"]
