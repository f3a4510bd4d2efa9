"""scripts/ablation_report.py: the docs/RESULTS.md tables and figures of the issue-10 ablation, on a fake
runs dir built from synthetic records run through the real `stats.summarize` (and the cost model)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dflash2.evaluation.cost import add_to_summary
from dflash2.evaluation.stats import summarize
from tests.evaluation.synthetic import synthetic_records

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ablation_report.py"
ALPHA = {"dflash2": 0.75, "conv": 0.65, "v1": 0.5}
RESAMPLES = 200
SHA = {"dflash2": "a" * 64, "conv": "b" * 64, "v1": "c" * 64}


def _load():
    spec = importlib.util.spec_from_file_location("ablation_report_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_run(path: Path, recs: list[dict], cost: bool = False) -> dict:
    path.mkdir(parents=True)
    s = summarize(recs, n_resamples=RESAMPLES)
    if cost:
        add_to_summary(s, recs)
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (path / "summary.json").write_text(json.dumps(s))
    return s


def _metrics(alpha: float) -> list[dict]:
    rows = []
    for step in range(50, 301, 50):
        loss = 5.0 * (1 - alpha) + 10.0 / step
        rows.append({"step": step, "epoch": 0, "lr": 1e-3, "loss": loss, "loss_unary": 0.7 * loss,
                     "loss_selector": 0.3 * loss, "tau_proxy": 1 + alpha * step / 300, "path_tau": 1 + alpha,
                     "recall_at_k": alpha, "grad_norm": 1.0, "samples_per_s": 4.0, "tokens_per_s": 900.0})
    rows.append({"step": 300, "eval/tau_proxy": 1 + alpha, "eval/tau_real": 1.5 + alpha, "eval/gap": -0.5})
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict]:
    """eval_<arm>_T{0,1} for the three checkpoints (eval_conv_T1 missing: not run), the N sweep, training files.
    The v1 runs hold fewer samples (10 per dataset vs 12) so the ratio must pair over the common ids."""
    root = tmp_path_factory.mktemp("ablation_runs")
    recs: dict = {}
    for i, (ck, alpha) in enumerate(ALPHA.items()):
        for t in (0.0, 1.0):
            if ck == "conv" and t == 1.0:
                continue
            r = synthetic_records(n_per_dataset=10 if ck == "v1" else 12, ns=(7,), alpha=alpha, temperature=t,
                                  seed=10 * i + int(t), selector_off=ck == "dflash2",
                                  flip={"dflash2@N=7": [0, 4]} if ck == "conv" else None)
            recs[(ck, t)] = r
            _write_run(root / f"eval_{ck}_T{t:g}", r)
    sweep = [r for r in synthetic_records(n_per_dataset=8, ns=(1, 2, 3, 5, 7, 10, 15), alpha=0.7, seed=99)
             if r["dataset"] == "gsm8k"]
    recs["sweep"] = sweep
    _write_run(root / "sweep_dflash2", sweep, cost=True)
    for ck, alpha in ALPHA.items():
        (root / f"metrics_{ck}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _metrics(alpha)))
    (root / "train_summary.txt").write_text(
        "final checkpoint: /x/final\n" + "".join(f"{SHA[ck]}  {ck}/final/model.safetensors\n" for ck in ALPHA))
    return root, recs


@pytest.fixture(scope="module")
def built(runs, tmp_path_factory):
    root, _ = runs
    out = tmp_path_factory.mktemp("docs")
    res = _load().main(["--runs", str(root), "--out", str(out / "RESULTS_tables.md"), "--figures",
                        str(out / "figures"), "--prefix", "ablation_", "--n-resamples", str(RESAMPLES)])
    return res, (out / "RESULTS_tables.md").read_text()


def _row(md: str, *cells: str) -> list[str]:
    """The first Markdown table row whose leading cells are `cells`."""
    for line in md.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if parts[: len(cells)] == list(cells):
            return parts
    raise AssertionError(f"no row starting with {cells}")


def _pooled(recs: list[dict], ids: set[str]) -> float:
    acc = [a for r in recs if r["sample_id"] in ids for a in r["accepted"]]
    return (sum(acc) + len(acc)) / len(acc)


def test_ratio_matches_hand_computation_over_common_samples(runs, built):
    _, recs = runs
    res, md = built
    num = [r for r in recs[("dflash2", 0.0)] if r["arm"] == "dflash2@N=7"]
    den = [r for r in recs[("v1", 0.0)] if r["arm"] == "dflash2@N=7"]
    common = {r["sample_id"] for r in num} & {r["sample_id"] for r in den}
    assert len(common) == 30  # v1 ran 10 per dataset, dflash2 12
    hand = _pooled(num, common) / _pooled(den, common)
    row = _row(md, "dflash2 / v1", "0", "all")
    assert row[3] == "30"
    assert row[4] == f"{_pooled(num, common):.3f}" and row[5] == f"{_pooled(den, common):.3f}"
    lo, hi = map(float, re.match(rf"{hand:.3f} \[([\d.]+), ([\d.]+)\]", row[6]).groups())
    assert lo < hand < hi and hi - lo < 1.0
    # alpha 0.75 vs 0.5 over 30 samples x dozens of steps: clearly above 1
    assert row[7] == "yes" and lo > 1.0
    # per dataset: the GSM8K ratio pairs only GSM8K ids
    gsm = {s for s in common if s.startswith("gsm8k/")}
    assert _row(md, "dflash2 / v1", "0", "gsm8k")[6].startswith(f"{_pooled(num, gsm) / _pooled(den, gsm):.3f} [")
    pts = [p for p in res["ratios"] if p["name"] == "dflash2 / v1" and p["T"] == 0 and p["dataset"] == "all"]
    assert pts[0]["ratio"] == pytest.approx(hand, rel=1e-12)
    # the within-run comparison exists at both temperatures
    assert _row(md, "dflash2 / dflash2 selector_off (same run)", "1", "all")[3] == "36"


def test_ratio_ci_is_the_stats_bootstrap_when_denominator_is_constant(runs):
    """With a constant denominator the ratio CI must equal stats' pooled-tau CI of the numerator / that
    constant: the same scipy percentile bootstrap, same seed, same resampled ids."""
    mod = _load()
    _, recs = runs
    num = {r["sample_id"]: r for r in recs[("dflash2", 0.0)] if r["arm"] == "dflash2@N=7"}
    den = {sid: dict(r, accepted=[1] * 4) for sid, r in num.items()}  # tau 2 on every sample, 4 steps each
    r = mod.tau_ratio(num, den, n_resamples=RESAMPLES, seed=0)
    s = summarize(recs[("dflash2", 0.0)], n_resamples=RESAMPLES)["per_arm"]["dflash2@N=7"]["overall"]
    assert r["ratio"] == pytest.approx(s["tau_pooled"] / 2)
    # stats resamples (produced, steps) pairs; here 4 arrays with the same ids: same draws, same CI
    assert r["ratio_ci"][0] == pytest.approx(s["tau_pooled_ci"][0] / 2, rel=1e-9)
    assert r["ratio_ci"][1] == pytest.approx(s["tau_pooled_ci"][1] / 2, rel=1e-9)


def test_per_arm_table_reads_the_summary(runs, built):
    root, _ = runs
    _, md = built
    s = json.loads((root / "eval_conv_T0" / "summary.json").read_text())
    o = s["per_arm"]["dflash2@N=7"]["overall"]
    row = _row(md, "conv", "dflash2@N=7", "all")
    lo, hi = o["tau_pooled_ci"]
    assert row[4] == f"{o['tau_pooled']:.2f} [{lo:.2f}, {hi:.2f}]"
    assert row[6] == f"{o['tau_pooled'] - 1:.2f} [{lo - 1:.2f}, {hi - 1:.2f}]"  # mean accepted per step
    assert row[7].startswith(f"{o['speedup']:.2f} [")
    assert row[10] == f"{o['mcnemar']['p']:.2g}"  # two flipped samples: discordant pairs
    assert o["discordance"] > 0  # summary.json stores the MDE's inf (too few samples) as null
    assert row[11] == ("undetectable" if o["mde_accuracy"] is None else f"{100 * o['mde_accuracy']:.1f}")
    assert _row(md, "dflash2", "dflash2@N=7", "all")[11] == "n/a (0 discordant)"  # lossless: nothing discordant
    ar = s["per_arm"]["ar"]["by_dataset"]["gsm8k"]
    assert _row(md, "conv", "dflash2@N=7", "gsm8k")[8].startswith(f"{100 * ar['accuracy']:.1f} [")
    # T=1: the logprob TOST p is shown; the dflash2 run has its selector-off arm
    t1 = json.loads((root / "eval_v1_T1" / "summary.json").read_text())["per_arm"]["dflash2@N=7"]["overall"]
    section = md.split("## Per checkpoint, arm and dataset, T=1")[1].split("##")[0]
    row1 = _row(section, "v1", "dflash2@N=7", "all")
    p = t1["tost_logprob_p"]
    assert row1[-1] == (f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}")
    assert _row(md, "dflash2", "selector_off@N=7", "mt_bench")[8] == "-"  # MT-Bench is not scored


def test_missing_runs_render_as_not_run(built):
    res, md = built
    assert "eval_conv_T1" in res["missing"]
    section = md.split("## Per checkpoint, arm and dataset, T=1")[1].split("##")[0]
    assert _row(section, "conv", "-", "all")[3:] == ["not run"] * 11
    assert _row(md, "conv / v1", "1", "all")[3] == "not run"
    assert _row(md, "dflash2 / conv", "1", "all")[6] == "not run"
    assert _row(md, "conv", "-", "1")[3:] == ["not run"] * 7


def test_per_position_is_conditional(runs, built):
    root, _ = runs
    _, md = built
    u = json.loads((root / "eval_dflash2_T0" / "summary.json").read_text())["per_arm"]["dflash2@N=7"]["overall"][
        "per_position_acceptance"]
    row = _row(md, "dflash2", "dflash2@N=7", "0")
    assert row[3] == f"{u[0]:.3f}" and row[5] == f"{u[2] / u[1]:.3f}"
    # Bernoulli(alpha) per slot until the first miss: the conditional acceptance is about alpha everywhere
    vals = [float(c) for c in row[3:6]]
    assert np.allclose(vals, ALPHA["dflash2"], atol=0.12)


def test_sweep_table_and_cost_model(runs, built):
    root, recs = runs
    _, md = built
    s = json.loads((root / "sweep_dflash2" / "summary.json").read_text())
    section = md.split("## N sweep")[1].split("## Training")[0]
    for n in (1, 2, 3, 5, 7, 10, 15):
        row = _row(section, str(n), f"dflash2@N={n}")
        o = s["per_arm"][f"dflash2@N={n}"]["overall"]
        assert row[2].startswith(f"{o['tau_pooled']:.2f} [") and row[5].startswith(f"{o['speedup']:.2f} [")
        assert row[4].startswith(f"{o['tokens_per_s']:.1f} [")
        assert row[6] == f"{s['cost_model']['arms'][f'dflash2@N={n}']['predicted_speedup']:.2f}"
        # the current cost model on the same records gives the same predictions (the summary here was
        # written by it), so its column is left out and a note says so
        assert len(row) == 8
    best = max((n for n in (1, 2, 3, 5, 7, 10, 15)), key=lambda n: s["per_arm"][f"dflash2@N={n}"]["overall"]["speedup"])
    assert f"best N measured (highest end-to-end speedup): N={best} " in section
    assert "the run's cost model is the current dflash2.engine.cost" in section
    assert f"N={s['cost_model']['best_n']['spec|T=0']['N']} " in section
    assert f"batch stragglers included): N={s['cost_model']['best_n']['spec|T=0']['N_end_to_end']}" in section


def test_training_tables(built):
    _, md = built
    row = _row(md, "v1", "300")
    assert row[2] == f"{5.0 * 0.5 + 10.0 / 300:.4f}"
    assert row[7] == f"{6 * 50 * 8 / 4.0:.0f}"  # 6 windows of 50 steps x batch 8 at 4 samples/s
    header = _row(md, "checkpoint", "steps")
    assert row[header.index("final eval/tau_real")] == f"{1.5 + 0.5:.3f}"  # the eval row after the last train row
    assert _row(md, "dflash2", "model.safetensors")[2] == SHA["dflash2"]


def test_figures_are_written_pngs(built):
    res, md = built
    assert set(res["figures"]) == {"per_position", "tau_ratio", "sweep", "training"}
    for name, path in res["figures"].items():
        assert path.name.startswith("ablation_")
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] > 300
        assert f"](figures/{path.name})" in md


def test_empty_runs_dir_still_renders(tmp_path):
    (tmp_path / "runs").mkdir()
    res = _load().main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "R.md"), "--figures",
                        str(tmp_path / "fig")])
    md = (tmp_path / "R.md").read_text()
    assert len(res["missing"]) == 10 and all(p.is_file() for p in res["figures"].values())
    assert md.count("not run") > 20
    with pytest.raises(FileNotFoundError, match="--runs"):
        _load().main(["--runs", str(tmp_path / "nope"), "--out", str(tmp_path / "R.md"), "--figures",
                      str(tmp_path / "fig")])


def test_coverage_counts_samples_every_arm_has_and_flags_cut_runs(runs, built, tmp_path):
    """Finished runs count every paired sample; a run cut short (records, no summary.json) is
    flagged and counts only samples for which every arm has a record."""
    _, md = built
    assert _row(md, "eval_v1_T0", "yes")[3:6] == ["10", "10", "10 (10 turn 1, 0 turn 2)"]
    assert _row(md, "eval_conv_T1")[1] == "not run"
    recs = synthetic_records(n_per_dataset=4, ns=(7,), seed=5)
    # cut short: the spec arm never reached the last two MT-Bench items, an MT-Bench turn 2 has AR only
    drop = {"mt_bench/83/turn1", "mt_bench/84/turn1"}
    recs = [r for r in recs if not (r["arm"] != "ar" and r["sample_id"] in drop)]
    recs.append({**next(r for r in recs if r["sample_id"] == "mt_bench/81/turn1" and r["arm"] == "ar"),
                 "sample_id": "mt_bench/81/turn2"})
    recs.append({**next(r for r in recs if r["sample_id"] == "mt_bench/81/turn1" and r["arm"] != "ar"),
                 "sample_id": "mt_bench/81/turn2"})
    root = tmp_path / "runs"
    (root / "eval_dflash2_T0").mkdir(parents=True)
    (root / "eval_dflash2_T0" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    _load().main(["--runs", str(root), "--out", str(tmp_path / "R.md"), "--figures", str(tmp_path / "fig"),
                  "--n-resamples", "50"])
    row = _row((tmp_path / "R.md").read_text(), "eval_dflash2_T0")
    assert row[1:6] == ["cut short", "ar, dflash2@N=7", "4", "4", "3 (2 turn 1, 1 turn 2)"]


def test_a_finished_run_is_re_summarized_from_its_records(tmp_path):
    """A summary written by older statistics (here: a row-bootstrap speedup CI on records whose rows
    share one batch) is recomputed from the records; the run's checks and cost model are kept."""
    mod = _load()
    recs = [dict(r, wall_s=2.0 if r["arm"] == "ar" else 1.0, batch_size=12)
            for r in synthetic_records(n_per_dataset=4, ns=(3,), flip={})]
    s = _write_run(tmp_path / "eval_conv_T0", recs)
    s["per_arm"]["dflash2@N=3"]["overall"]["speedup_ci"] = [2.0, 2.0]  # what a row bootstrap gave
    s.pop("settings")  # as written before summaries kept their settings
    s.update(checks={"kept": True}, cost_model={"label": "from the run"})
    (tmp_path / "eval_conv_T0" / "summary.json").write_text(json.dumps(s))
    run = mod.load_run(tmp_path / "eval_conv_T0", notes := [])
    o = run["summary"]["per_arm"]["dflash2@N=3"]["overall"]
    assert o["speedup"] == pytest.approx(2.0) and o["speedup_batches"] == 1 and o["speedup_ci"] == [None, None]
    assert run["summary"]["checks"] == {"kept": True} and run["summary"]["cost_model"]["label"] == "from the run"
    assert run["summary"]["settings"]["n_resamples"] == 2000 and not notes
