"""Tables and figures of the issue-10 ablation (scripts/gpu_ablation.sh) for docs/RESULTS.md.

    python scripts/ablation_report.py --runs DIR --out docs/RESULTS_tables.md --figures docs/figures \
        --prefix ablation_

DIR holds what gpu_ablation.sh brings back, unpacked (`tar xzf ablation_eval.tgz -C DIR` plus the
training files copied beside it):

    eval_<arm>_T<t>/summary.json (+ records.jsonl)   arm in dflash2, conv, v1; t in 0, 1
    sweep_dflash2/summary.json (+ records.jsonl)       GSM8K, T=0, N in {1, 2, 3, 5, 7, 10, 15}
    metrics_<arm>.jsonl                                 training log rows (dflash2/training/metrics.py)
    train_summary.txt                                   `sha256sum` lines of the final checkpoints

The statistics of a run come from `stats.summarize` on its records.jsonl, re-run here with the
run's own settings (its summary's `settings`; 2000 resamples, seed 0 for summaries written before
that key), so that a fix to the statistics reaches runs measured before it (2026-11-30: speedup
CIs resample generation batches, not rows). What only the run could know (its checks, prompt
format, the cost model fitted when it ran) is read from its summary.json. Computed here, with
the same percentile-bootstrap machinery as `dflash2.evaluation.stats` (scipy.stats.bootstrap,
paired): the tau ratio between two checkpoints over the sample ids both ran (resampling samples),
and the CI of tokens/s in the sweep (resampling generation batches). A missing run renders as
"not run" in its cells, so partial results still make a document.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a fresh clone without install

import numpy as np  # noqa: E402

from dflash2.evaluation import stats  # noqa: E402
from dflash2.evaluation.report import _ci, _f, _md_table, _p, _pct, plt, read_jsonl  # noqa: E402  (Agg backend set there)

NOT_RUN = "not run"
CHECKPOINTS = ("dflash2", "conv", "v1")
RATIOS = (("dflash2", "v1"), ("dflash2", "conv"), ("conv", "v1"))
TRAIN_KEYS = ("loss", "loss_unary", "loss_selector", "tau_proxy", "path_tau", "recall_at_k")


# ------------------------------------------------------------------------------ loading


def load_run(path: Path, notes: list[str]) -> dict | None:
    """`{"summary": dict, "records": list | None}` of an eval run dir, or None when it was not run.

    A run dir with records but no summary (killed before the end) is summarized here with
    `stats.summarize` (the runner's defaults), and says so in `notes`.
    """
    summ, recs = path / "summary.json", path / "records.jsonl"
    if not path.is_dir() or not (summ.is_file() or recs.is_file()):
        return None
    try:
        records = read_jsonl(recs) if recs.is_file() else None
        if summ.is_file():
            summary = json.loads(summ.read_text())
            if records:
                kept = {k: summary[k] for k in ("checks", "run_id", "prompt_format", "cost_model") if k in summary}
                summary = {**stats.summarize(records, **(summary.get("settings") or {"n_resamples": 2000})), **kept}
        elif records:
            summary = stats.summarize(records)
            notes.append(f"{path.name}: no summary.json; summarized from records.jsonl here (2000 resamples, seed 0)")
        else:
            return None
    except (OSError, ValueError) as e:  # a damaged run is reported, the others still render
        notes.append(f"{path.name}: unreadable ({e}); shown as not run")
        return None
    return {"summary": summary, "records": records or None, "finished": summ.is_file()}


def load_metrics(runs: Path, ckpt: str) -> list[dict] | None:
    """Training log rows of a checkpoint: DIR/metrics_<ckpt>.jsonl, else DIR/<ckpt>/metrics.jsonl."""
    for p in (runs / f"metrics_{ckpt}.jsonl", runs / ckpt / "metrics.jsonl"):
        if p.is_file():
            rows = read_jsonl(p)
            return rows or None
    return None


def read_shas(path: Path) -> dict[str, list[tuple[str, str]]]:
    """`sha256sum` lines of train_summary.txt -> {checkpoint: [(file, sha256)]}; other lines ignored."""
    out: dict[str, list[tuple[str, str]]] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"^([0-9a-f]{64})\s+\*?(\S+)\s*$", line.strip())
        if m:
            rel = Path(m.group(2))
            out.setdefault(rel.parts[0], []).append((rel.name, m.group(1)))
    return out


# ------------------------------------------------------------------------------ helpers


def _t(t: float) -> str:
    return f"{t:g}"


def _shift(v, ci, d: float):
    """Value and CI shifted by d (mean accepted per step = pooled tau - 1)."""
    if v is None:
        return None, None
    return v + d, ([c + d for c in ci] if ci and ci[0] is not None else None)


def _mde(m: dict) -> str:
    """MDE in accuracy points; summary.json stores nan (no discordant pairs) and inf (undetectable) as null."""
    if "discordance" not in m:
        return "-"
    if m.get("mde_accuracy") is not None:
        return _f(100 * m["mde_accuracy"], 1)
    return "n/a (0 discordant)" if not m["discordance"] else "undetectable"


def _speedup(m: dict) -> str:
    """Speedup with its CI and how many timed batches the CI resampled (few batches: a rough CI)."""
    cell = _ci(m.get("speedup"), m.get("speedup_ci"))
    k = m.get("speedup_batches")
    return cell if m.get("speedup") is None or k is None else f"{cell} ({k} batch{'es' if k != 1 else ''})"


def _rows_for(summary: dict, arm: str, dataset: str | None) -> dict | None:
    e = summary["per_arm"].get(arm)
    if e is None:
        return None
    return e["overall"] if dataset is None else e["by_dataset"].get(dataset)


def _arm_of(summary: dict, kind: str, n: int) -> str | None:
    """Label of the arm of `kind` ("spec", "selector_off") at N = n in a single-temperature summary."""
    for a in summary["arms"]:
        e = summary["per_arm"][a]
        if e["arm_kind"] == kind and int(e["num_speculative_tokens"]) == n:
            return a
    return None


def _latest_by_sample(records: list[dict], kind: str, n: int) -> dict[str, dict]:
    """One record per sample_id of the arm (kind, N); a later record replaces an earlier one (as stats does)."""
    return {r["sample_id"]: r for r in records if r["arm_kind"] == kind and int(r["num_speculative_tokens"]) == n}


def _produced_steps(recs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Per record: tokens produced incl. the bonus, sum(accepted + 1), and decode steps. Shapes [n], [n]."""
    acc = [np.asarray(r["accepted"] or [], dtype=np.int64) for r in recs]
    return (np.array([a.sum() + a.size for a in acc], dtype=float), np.array([a.size for a in acc], dtype=float))


# ------------------------------------------------------------------------------ statistics computed here


def tau_ratio(num: dict[str, dict], den: dict[str, dict], n_resamples: int = 2000, seed: int = 0,
              dataset: str | None = None) -> dict:
    """Ratio of pooled tau, num / den, over the sample ids both ran, with a paired bootstrap 95% CI.

    Each resample draws sample ids with replacement (the same ids for both arms: same prompts,
    same T) and recomputes (sum(acc+1)/steps)_num / (sum(acc+1)/steps)_den, exactly the pooled
    tau of stats.py on the resampled set; percentile interval as in `stats.paired_bootstrap_ci`.

    Args:
        num, den: {sample_id: record} of the two arms (`_latest_by_sample`).
        dataset: restrict to one dataset (None: all).
    Returns:
        dict n, tau_num, tau_den, ratio, ratio_ci (None where undefined).
    """
    from scipy.stats import bootstrap

    # In `num`'s record order (as stats.summarize orders an arm's samples), so that with one arm's
    # figures the resampled ids, hence the CI, are those of the summary's pooled-tau CI.
    ids = [s for s in num if s in den and (dataset is None or num[s]["dataset"] == dataset)]
    out = {"n": len(ids), "tau_num": None, "tau_den": None, "ratio": None, "ratio_ci": None}
    if not ids:
        return out
    pa, sa = _produced_steps([num[s] for s in ids])
    pb, sb = _produced_steps([den[s] for s in ids])
    if sa.sum() == 0 or sb.sum() == 0:
        return out
    out["tau_num"], out["tau_den"] = float(pa.sum() / sa.sum()), float(pb.sum() / sb.sum())
    out["ratio"] = out["tau_num"] / out["tau_den"]

    def stat(a, b, c, d, axis=-1):  # [..., n] each -> [...]
        return (a.sum(axis) / b.sum(axis)) / (c.sum(axis) / d.sum(axis))

    if len(ids) >= 2:
        res = bootstrap((pa, sa, pb, sb), stat, n_resamples=int(n_resamples), rng=np.random.default_rng(seed),
                        paired=True, vectorized=True, method="percentile", confidence_level=stats.CONFIDENCE)
        out["ratio_ci"] = (float(res.confidence_interval.low), float(res.confidence_interval.high))
    return out


def tokens_per_s_ci(records: list[dict], arm: str, n_resamples: int, seed: int) -> tuple | None:
    """95% CI of an arm's tokens/s (total tokens / total wall time), resampling its generation batches
    (a batch's rows share one timing; stats.batch_key); None with fewer than 2 batches."""
    recs = list({r["sample_id"]: r for r in records if r["arm"] == arm}.values())
    tok, wall = stats.batch_totals(recs, [len(r["tokens"] or []) for r in recs], [float(r["wall_s"]) for r in recs])
    if len(wall) < 2 or wall.sum() <= 0:
        return None
    return stats.paired_bootstrap_ci(tok, wall, lambda a, b, axis=-1: a.sum(axis) / b.sum(axis), n_resamples, seed,
                                     vectorized=True)


def conditional_acceptance(unconditional: list) -> list[float | None]:
    """P(slot i accepted | slots < i accepted) = u_i / u_{i-1} from u_i = P(>= i accepted) (u_0 = 1);
    None where no step reached slot i."""
    out, prev = [], 1.0
    for u in unconditional:
        out.append(None if u is None or not prev else float(u) / prev)
        prev = u if u is not None else 0.0
    return out


def train_time_s(rows: list[dict], batch_size: int) -> float | None:
    """Seconds spent in the logged training windows: each row covers (step - previous step) optimizer
    steps at `samples_per_s` over a global batch of `batch_size` (evaluation and checkpoints excluded)."""
    prev, total = 0, 0.0
    for r in rows:
        if "samples_per_s" not in r:
            continue
        sps = float(r["samples_per_s"]) if r["samples_per_s"] not in (None, "nan", "inf") else 0.0
        if sps <= 0:
            return None
        total += (int(r["step"]) - prev) * batch_size / sps
        prev = int(r["step"])
    return total if prev else None


# ------------------------------------------------------------------------------ tables


def coverage_table(runs: dict, temps: list[float], datasets: list[str]) -> tuple[list[str], list[list[str]]]:
    """What each eval run holds: finished (it wrote summary.json) or cut short, and per dataset the
    number of samples every arm of the run has a record for, split by MT-Bench turn where present."""
    header = ["run", "finished", "arms", *datasets]
    rows = []
    for ck in CHECKPOINTS:
        for t in temps:
            r = runs.get((ck, t))
            name = f"eval_{ck}_T{_t(t)}"
            if r is None:
                rows.append([name, NOT_RUN, "", *[""] * len(datasets)])
                continue
            recs = r["records"] or []
            arms = sorted({x["arm"] for x in recs})
            have: dict[str, set] = {}
            for x in recs:
                have.setdefault(x["arm"], set()).add(x["sample_id"])
            paired = set.intersection(*have.values()) if have else set()
            cells = []
            for d in datasets:
                ids = [i for i in paired if i.split("/")[0] == d]
                if any(i.rsplit("/", 1)[-1].startswith("turn") for i in ids):  # MT-Bench: split by turn
                    per = {tn: sum(1 for i in ids if i.endswith("/" + tn)) for tn in ("turn1", "turn2")}
                    cells.append(f"{len(ids)} ({per['turn1']} turn 1, {per['turn2']} turn 2)")
                else:
                    cells.append(str(len(ids)))
            rows.append([name, "yes" if r.get("finished") else "cut short", ", ".join(arms), *cells])
    return header, rows


def per_arm_table(runs: dict, t: float, datasets: list[str], n: int) -> tuple[list[str], list[list[str]]]:
    """Item 1: per checkpoint x arm x dataset at temperature t."""
    header = ["checkpoint", "arm", "dataset", "n", "tau pooled [95% CI]", "tau per-request [95% CI]",
              "accepted/step [95% CI]", "speedup vs AR [95% CI]", "AR acc % [95% CI]", "arm acc % [95% CI]",
              "McNemar p", "MDE pts", "identical to AR %", "TOST logprob p"]
    rows = []
    for ck in CHECKPOINTS:
        run = runs.get((ck, t))
        if run is None:
            rows.append([ck, "-", "all"] + [NOT_RUN] * (len(header) - 3))
            continue
        s = run["summary"]
        arms = [a for a in (_arm_of(s, "spec", n), _arm_of(s, "selector_off", n)) if a]
        if not arms:
            rows.append([ck, f"no arm at N={n}", "all"] + [NOT_RUN] * (len(header) - 3))
        for arm in arms:
            for ds in [None] + datasets:
                m = _rows_for(s, arm, ds)
                if m is None:
                    continue
                ar = _rows_for(s, "ar", ds) or {}
                acc_step = _shift(m.get("tau_pooled"), m.get("tau_pooled_ci"), -1.0)
                rows.append([
                    ck, arm, ds or "all", str(m.get("n", 0)), _ci(m.get("tau_pooled"), m.get("tau_pooled_ci")),
                    _ci(m.get("tau_per_request"), m.get("tau_per_request_ci")), _ci(*acc_step),
                    _speedup(m),
                    _pct(ar.get("accuracy"), ar.get("accuracy_ci")) if ar.get("n_scored") else "-",
                    _pct(m.get("accuracy"), m.get("accuracy_ci")) if m.get("n_scored") else "-",
                    _p((m.get("mcnemar") or {}).get("p")), _mde(m), _pct(m.get("identical_fraction")),
                    _p(m.get("tost_logprob_p"))])
    return header, rows


def ratio_table(runs: dict, temps: list[float], datasets: list[str], n: int, n_resamples: int,
                seed: int) -> tuple[list[str], list[list[str]], list[dict]]:
    """Item 2: tau ratios between checkpoints (and DFlash2 vs its own selector-off arm), per T and dataset."""
    header = ["ratio", "T", "dataset", "common samples", "tau pooled (numerator)", "tau pooled (denominator)",
              "ratio [95% CI]", "CI excludes 1"]
    rows, points = [], []
    for t in temps:
        pairs = [(f"{a} / {b}", runs.get((a, t)), "spec", runs.get((b, t)), "spec") for a, b in RATIOS]
        pairs.append(("dflash2 / dflash2 selector_off (same run)", runs.get(("dflash2", t)), "spec",
                      runs.get(("dflash2", t)), "selector_off"))
        for name, ra, ka, rb, kb in pairs:
            if ra is None or rb is None or not ra["records"] or not rb["records"]:
                why = NOT_RUN if ra is None or rb is None else "not run (no records.jsonl)"
                rows.append([name, _t(t), "all", why, why, why, why, why])
                continue
            num, den = _latest_by_sample(ra["records"], ka, n), _latest_by_sample(rb["records"], kb, n)
            if not num or not den:
                rows.append([name, _t(t), "all"] + [f"{NOT_RUN} (no {ka if not num else kb} arm at N={n})"] * 5)
                continue
            for ds in [None] + datasets:
                r = tau_ratio(num, den, n_resamples, seed, ds)
                if r["n"] == 0:
                    continue
                ci = r["ratio_ci"]
                excl = "-" if not ci else ("yes" if ci[0] > 1 or ci[1] < 1 else "no")
                rows.append([name, _t(t), ds or "all", str(r["n"]), _f(r["tau_num"], 3), _f(r["tau_den"], 3),
                             _ci(r["ratio"], ci, 3), excl])
                points.append({"name": name, "T": t, "dataset": ds or "all", **r})
    return header, rows, points


def position_table(runs: dict, temps: list[float], n: int) -> tuple[list[str], list[list[str]], dict]:
    """Item 3: conditional per-position acceptance per checkpoint arm and T (from the summaries)."""
    header = ["checkpoint", "arm", "T"] + [f"slot {i}" for i in range(1, n + 1)]
    rows, curves = [], {}
    for t in temps:
        for ck in CHECKPOINTS:
            run = runs.get((ck, t))
            if run is None:
                rows.append([ck, "-", _t(t)] + [NOT_RUN] * n)
                continue
            s = run["summary"]
            for kind in ("spec", "selector_off"):
                arm = _arm_of(s, kind, n)
                if arm is None:
                    continue
                cond = conditional_acceptance(s["per_arm"][arm]["overall"]["per_position_acceptance"])
                rows.append([ck, arm, _t(t)] + [_f(c, 3) for c in cond])
                curves[(t, ck, kind)] = cond
    return header, rows, curves


def sweep_table(sweep: dict | None, n_resamples: int, seed: int) -> tuple[list[str], list[list[str]], list[str],
                                                                            list[dict]]:
    """Item 4: N vs measured tau, tokens/s, speedup (CIs) and the cost model's prediction; notes on best N."""
    header = ["N", "arm", "tau pooled [95% CI]", "tau per-request [95% CI]", "tokens/s [95% CI]",
              "speedup vs AR [95% CI]", "predicted speedup (cost model)", "predicted tau",
              "predicted speedup (current cost model)"]
    if sweep is None:
        return header, [["-", NOT_RUN] + [NOT_RUN] * (len(header) - 2)], [f"N sweep: {NOT_RUN}"], []
    from dflash2.evaluation.cost import for_report

    s, recs = sweep["summary"], sweep["records"]
    # The run's own cost model (summary.json, as written when the sweep ran), and the current
    # dflash2.engine.cost on the same records: the two differ when the model changed since.
    now = for_report(recs)[0] if recs else {}
    cm = s.get("cost_model") or now  # an older summary without one: the current model on its records
    rows, pts = [], []
    t = (s.get("temperatures") or [0.0])[0]
    for arm in s["arms"]:
        e = s["per_arm"][arm]
        if e["arm_kind"] != "spec":
            continue
        o = e["overall"]
        pred = (cm.get("arms") or {}).get(arm) or (cm.get("arms") or {}).get(f"{arm}|T={_t(t)}") or {}
        pred_now = (now.get("arms") or {}).get(arm) or (now.get("arms") or {}).get(f"{arm}|T={_t(t)}") or {}
        tps_ci = tokens_per_s_ci(recs, arm, n_resamples, seed) if recs else None
        rows.append([str(e["num_speculative_tokens"]), arm, _ci(o.get("tau_pooled"), o.get("tau_pooled_ci")),
                     _ci(o.get("tau_per_request"), o.get("tau_per_request_ci")),
                     _ci(o.get("tokens_per_s"), tps_ci, 1), _speedup(o),
                     _f(pred.get("predicted_speedup")), _f(pred.get("predicted_tau")),
                     _f(pred_now.get("predicted_speedup"))])
        pts.append({"N": int(e["num_speculative_tokens"]), "tau": o.get("tau_pooled"), "tau_ci": o.get("tau_pooled_ci"),
                    "speedup": o.get("speedup"), "speedup_ci": o.get("speedup_ci"),
                    "predicted": pred.get("predicted_speedup"), "predicted_now": pred_now.get("predicted_speedup")})
    notes = []
    if all(r[6] == r[8] for r in rows):  # the run's own cost model is the current one: one column says it
        header, rows = header[:-1], [r[:-1] for r in rows]
        notes.append("the run's cost model is the current dflash2.engine.cost (re-fitted here: the same predictions)")
    measured = [p for p in pts if p["speedup"] is not None]
    if measured:
        b = max(measured, key=lambda p: p["speedup"])
        notes.append(f"best N measured (highest end-to-end speedup): N={b['N']} ({_ci(b['speedup'], b['speedup_ci'])})")
    for fam, v in (cm.get("best_n") or {}).items():
        notes.append(f"best N predicted by the cost model ({fam}, by decode tokens/s): N={v.get('N')} "
                     f"({v.get('note')})")
    for fam, v in (now.get("best_n") or {}).items():
        if v.get("N_end_to_end") is not None:
            notes.append(f"best N predicted by the current cost model ({fam}, by end-to-end speedup, each row's own "
                         f"acceptance, batch stragglers included): N={v['N_end_to_end']}")
    if cm.get("label"):
        notes.append(f"cost model: {cm['label']}")
    for key in ("skipped", "error"):
        if isinstance(cm.get(key), str):
            notes.append(f"cost model {key}: {cm[key]}")
    return header, rows, notes, pts


def training_tables(metrics: dict, shas: dict, batch_size: int) -> tuple[tuple, tuple]:
    """Item 5: final training metrics per checkpoint, and the checkpoint SHA-256 table."""
    evals = sorted({k for rows in metrics.values() if rows for r in rows for k in r if k.startswith("eval/")})
    header = ["checkpoint", "steps", "final loss", "final loss_unary", "final loss_selector", "final tau_proxy",
              "final path_tau", "train time s (logged windows)"] + [f"final {k}" for k in evals]
    rows = []
    for ck in CHECKPOINTS:
        rs = metrics.get(ck)
        train = [r for r in rs or [] if "loss" in r]
        if not train:
            rows.append([ck] + [NOT_RUN] * (len(header) - 1))
            continue
        last = train[-1]
        ev = {k: next((r[k] for r in reversed(rs) if k in r), None) for k in evals}
        num = lambda v: v if isinstance(v, (int, float)) else None  # noqa: E731  ("nan" strings from the log)
        rows.append([ck, str(last["step"])] + [_f(num(last.get(k)), 4) for k in TRAIN_KEYS[:3]]
                    + [_f(num(last.get(k)), 3) for k in ("tau_proxy", "path_tau")]
                    + [_f(train_time_s(rs, batch_size), 0)] + [_f(num(ev[k]), 3) for k in evals])
    sha_rows = []
    for ck in CHECKPOINTS:
        files = shas.get(ck)
        sha_rows += [[ck, f, h] for f, h in files] if files else [[ck, NOT_RUN, NOT_RUN]]
    return (header, rows), (["checkpoint", "file", "SHA-256"], sha_rows)


# ------------------------------------------------------------------------------ figures


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def _yerr(vals: list, cis: list):
    if any(c is None or c[0] is None for c in cis):
        return None
    return [[v - c[0] for v, c in zip(vals, cis)], [c[1] - v for v, c in zip(vals, cis)]]


def position_figure(curves: dict, temps: list[float], n: int, path: Path) -> Path:
    fig, axes = plt.subplots(1, len(temps), figsize=(5.2 * len(temps), 4.0), dpi=100, squeeze=False)
    colors = {ck: f"C{i}" for i, ck in enumerate(CHECKPOINTS)}
    for ax, t in zip(axes[0], temps):
        for (tt, ck, kind), cond in curves.items():
            if tt != t:
                continue
            pos = [i for i, c in enumerate(cond, start=1) if c is not None]
            ax.plot(pos, [cond[i - 1] for i in pos], marker="o", color=colors[ck],
                    linestyle="-" if kind == "spec" else "--", label=ck if kind == "spec" else f"{ck} selector off")
        ax.set_title(f"T={_t(t)}")
        ax.set_xlabel("draft slot i")
        ax.set_xticks(range(1, n + 1))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, NOT_RUN, ha="center", transform=ax.transAxes)
    axes[0][0].set_ylabel("P(slot i accepted | slots < i accepted)")
    fig.suptitle(f"Conditional per-position acceptance, N={n}")
    fig.tight_layout()
    return _save(fig, path)


def ratio_figure(points: list[dict], path: Path) -> Path:
    pts = [p for p in points if p["ratio"] is not None]
    fig, ax = plt.subplots(figsize=(7.0, 0.32 * max(len(pts), 3) + 1.2), dpi=100)
    labels = [f"{p['name']}, T={_t(p['T'])}, {p['dataset']}" for p in pts]
    ys = list(range(len(pts)))[::-1]
    for y, p in zip(ys, pts):
        ci = p["ratio_ci"]
        xerr = [[p["ratio"] - ci[0]], [ci[1] - p["ratio"]]] if ci else None
        ax.errorbar([p["ratio"]], [y], xerr=xerr, marker="o" if p["dataset"] == "all" else ".", capsize=3,
                    color="C0" if p["T"] == 0 else "C3")
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel("ratio of pooled tau (paired bootstrap 95% CI)")
    ax.set_title("tau ratios (blue T=0, red T=1)" if pts else f"tau ratios: {NOT_RUN}")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return _save(fig, path)


def sweep_figure(pts: list[dict], path: Path) -> Path:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.4, 4.0), dpi=100)
    pts = sorted(pts, key=lambda p: p["N"])
    for ax, key, label in ((a1, "tau", "tau pooled (incl. bonus)"), (a2, "speedup", "speedup vs AR (wall time)")):
        ok = [p for p in pts if p[key] is not None]
        if ok:
            ax.errorbar([p["N"] for p in ok], [p[key] for p in ok], yerr=_yerr([p[key] for p in ok],
                        [p[f"{key}_ci"] for p in ok]), marker="o", capsize=4, label="measured (95% CI)")
        ax.set_xlabel("num_speculative_tokens N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    pred = [p for p in pts if p["predicted"] is not None]
    if pred:
        a2.plot([p["N"] for p in pred], [p["predicted"] for p in pred], marker="s", linestyle="--",
                label="cost model prediction (when run)")
    now = [p for p in pts if p.get("predicted_now") is not None]
    if now and any(p.get("predicted_now") != p["predicted"] for p in now):
        a2.plot([p["N"] for p in now], [p["predicted_now"] for p in now], marker="^", linestyle="-.",
                label="current cost model (batch stragglers)")
    a2.axhline(1.0, color="grey", linestyle=":", label="AR")
    if pts:
        a2.legend(fontsize=8)
    else:
        a1.text(0.5, 0.5, NOT_RUN, ha="center", transform=a1.transAxes)
    fig.suptitle("DFlash2 N sweep (GSM8K, T=0)")
    fig.tight_layout()
    return _save(fig, path)


def training_figure(metrics: dict, path: Path) -> Path:
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.4, 4.0), dpi=100)
    for i, ck in enumerate(CHECKPOINTS):
        rows = metrics.get(ck) or []
        train = [r for r in rows if "loss" in r]
        c = f"C{i}"
        for key, ls in (("loss", "-"), ("loss_unary", "--")):
            pts = [(r["step"], r[key]) for r in train if isinstance(r.get(key), (int, float))]
            if pts:
                a1.plot(*zip(*pts), color=c, linestyle=ls, label=f"{ck} {key}")
        pts = [(r["step"], r["tau_proxy"]) for r in train if isinstance(r.get("tau_proxy"), (int, float))]
        if pts:
            a2.plot(*zip(*pts), color=c, alpha=0.6, label=f"{ck} tau_proxy (train)")
        for j, key in enumerate(sorted({k for r in rows for k in r if k.startswith("eval/") and "gap" not in k})):
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if pts:
                a2.plot(*zip(*pts), color=c, marker="osx^v"[j % 5], linestyle=":", label=f"{ck} {key}")
    a1.set_yscale("log")
    for ax, title in ((a1, "training loss"), (a2, "tau proxies and validation (incl. bonus)")):
        ax.set_xlabel("optimizer step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, NOT_RUN, ha="center", transform=ax.transAxes)
    fig.tight_layout()
    return _save(fig, path)


# ------------------------------------------------------------------------------ document


def build(runs_dir: Path, out: Path, figures: Path, prefix: str = "ablation_", n: int = 7,
          temps: tuple[float, ...] = (0.0, 1.0), n_resamples: int = 2000, seed: int = 0,
          train_batch_size: int = 8) -> dict:
    """Write the Markdown tables to `out` and the PNG figures under `figures`.

    Returns:
        {"markdown": path, "figures": {name: path}, "ratios": [ratio dicts], "missing": [run dirs]}.
    """
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"--runs {runs_dir} is not a directory; pass the folder where the ablation results "
                                "(eval_*_T*/, sweep_dflash2/, metrics_*.jsonl, train_summary.txt) were unpacked")
    notes: list[str] = []
    temps = sorted(float(t) for t in temps)
    runs, missing = {}, []
    for ck in CHECKPOINTS:
        for t in temps:
            name = f"eval_{ck}_T{_t(t)}"
            r = load_run(runs_dir / name, notes)
            if r is None:
                missing.append(name)
            else:
                runs[(ck, t)] = r
    sweep = load_run(runs_dir / "sweep_dflash2", notes)
    if sweep is None:
        missing.append("sweep_dflash2")
    metrics = {ck: load_metrics(runs_dir, ck) for ck in CHECKPOINTS}
    missing += [f"metrics_{ck}.jsonl" for ck, m in metrics.items() if m is None]
    shas = read_shas(runs_dir / "train_summary.txt")
    datasets = sorted({d for r in runs.values() for d in r["summary"].get("datasets", [])})

    figs = {
        "per_position": position_figure(position_table(runs, temps, n)[2], temps, n,
                                        figures / f"{prefix}per_position_acceptance.png"),
    }
    r_header, r_rows, ratio_points = ratio_table(runs, temps, datasets, n, n_resamples, seed)
    figs["tau_ratio"] = ratio_figure(ratio_points, figures / f"{prefix}tau_ratio.png")
    s_header, s_rows, s_notes, s_pts = sweep_table(sweep, n_resamples, seed)
    figs["sweep"] = sweep_figure(s_pts, figures / f"{prefix}sweep.png")
    figs["training"] = training_figure(metrics, figures / f"{prefix}training_curves.png")
    (t_header, t_rows), (h_header, h_rows) = training_tables(metrics, shas, train_batch_size)
    rel = lambda p: Path(os.path.relpath(p, out.resolve().parent)).as_posix()  # noqa: E731

    md = ["<!-- generated by scripts/ablation_report.py; edit the script, not this file -->",
          "# Ablation results: DFlash2 vs conv-only vs DFlash v1 (SmolLM2-135M target)", "",
          f"Runs: `{runs_dir}`. tau includes the bonus token; pooled tau = sum(accepted + 1) / steps; "
          "per-request tau = mean over samples of each sample's mean(accepted + 1). CIs: 95% percentile "
          f"bootstrap over samples ({n_resamples} resamples for the ratios here; the summaries' own setting "
          "elsewhere); accuracy: Wilson. Speedup = AR wall time / arm wall time in the same process; its CI "
          "(and the sweep's tokens/s CI) resamples generation batches instead, the unit that is timed, and "
          "the cell says how many there were.", ""]
    md += [f"- not run / missing: {', '.join(missing)}" if missing else "- all runs present"]
    md += [f"- note: {x}" for x in notes] + [""]
    c_header, c_rows = coverage_table(runs, temps, datasets)
    md += ["## Coverage (samples with a record from every arm of the run)", "", _md_table(c_header, c_rows), "",
           "A run cut short by its time limit keeps the records it finished; the samples run in order "
           "(datasets in turn, MT-Bench second turns last), so later datasets are the ones short.", ""]
    for t in temps:
        h, rows = per_arm_table(runs, t, datasets, n)
        md += [f"## Per checkpoint, arm and dataset, T={_t(t)}", "", _md_table(h, rows), ""]
    md += ["MDE: McNemar minimum detectable accuracy difference (alpha 0.05, power 0.8) at the observed "
           "discordance. TOST logprob: T > 0 only, paired TOST on the target's mean per-token log-probability "
           "vs AR (small p = equivalent).", ""]
    md += ["## tau ratios (paired bootstrap over common sample ids)", "", _md_table(r_header, r_rows), "",
           f"![tau ratios]({rel(figs['tau_ratio'])})", ""]
    p_header, p_rows, _ = position_table(runs, temps, n)
    md += ["## Conditional per-position acceptance P(slot i accepted | slots < i accepted)", "",
           _md_table(p_header, p_rows), "", f"![per-position acceptance]({rel(figs['per_position'])})", ""]
    md += ["## N sweep (DFlash2, GSM8K, T=0)", "", _md_table(s_header, s_rows), ""] + [f"- {x}" for x in s_notes]
    md += ["", f"![N sweep]({rel(figs['sweep'])})", ""]
    md += ["## Training", "", _md_table(t_header, t_rows), "",
           f"Train time: sum over log windows of steps x global batch ({train_batch_size}) / samples_per_s "
           "(evaluation and checkpoint saves excluded).", "", _md_table(h_header, h_rows), "",
           f"![training curves]({rel(figs['training'])})", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(md))
    return {"markdown": out, "figures": figs, "ratios": ratio_points, "missing": missing}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True, help="folder with eval_<arm>_T<t>/, sweep_dflash2/, ...")
    ap.add_argument("--out", type=Path, required=True, help="Markdown file to write (e.g. docs/RESULTS_tables.md)")
    ap.add_argument("--figures", type=Path, required=True, help="folder for the PNG figures (e.g. docs/figures)")
    ap.add_argument("--prefix", default="ablation_", help="figure file name prefix (default ablation_)")
    ap.add_argument("--n", type=int, default=7, help="num_speculative_tokens of the compared arms (default 7)")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples for the ratio CIs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-batch-size", type=int, default=8,
                    help="global batch of the training runs (gpu_ablation.sh: train.batch_size=8), for the train time")
    a = ap.parse_args(argv)
    if a.n < 1 or a.n_resamples < 1 or a.train_batch_size < 1:
        ap.error(f"--n, --n-resamples and --train-batch-size must be >= 1 (got {a.n}, {a.n_resamples}, "
                 f"{a.train_batch_size})")
    res = build(a.runs, a.out, a.figures, a.prefix, a.n, tuple(a.temperatures), a.n_resamples, a.seed,
                a.train_batch_size)
    print(f"wrote {res['markdown']} and {len(res['figures'])} figures under {a.figures}"
          + (f"; not run: {', '.join(res['missing'])}" if res["missing"] else ""))
    return res


if __name__ == "__main__":
    main()
