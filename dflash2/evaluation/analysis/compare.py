"""Cross-run comparison of evaluation runs: the ablation's tables and figures (DFlash2 vs conv-only
vs DFlash v1, or any set of drafters evaluated with `eval/run.py`).

    python eval/report.py --compare ROOT/eval/* --sweep ROOT/sweep/* --out ROOT/compare
    python eval/report.py --compare dflash2=RUN_A v1=RUN_B --out DIR --n 7

Public: `compare_runs(runs, out_dir, ...)` (writes `out_dir/compare.md`, `compare.json` and
`figures/*.png`, returns what it wrote and the numbers), `load_run(spec)`, `tau_ratio(num, den)`,
`conditional_acceptance(u)`, `drafter_colours(names)`.

What is compared. Each RUN is an `eval/run.py` output directory (its `records.jsonl`), named by
the drafter it evaluated: `NAME=DIR` when given, else the distillation run that wrote its
checkpoint (`.../<name>/final` -> `<name>`: the ablation presets train arm `a` into
`ROOT/train/a`), else the directory name. A run with several temperatures counts once per
temperature. Every number is recomputed here from the records with `stats.summarize`
(`n_resamples`, `seed`), so a comparison never mixes statistics of different code versions; only
the cost model's predicted speedups are read from a run's `summary.json`.

- **Arms** (per drafter, T, dataset): tau pooled and per request with 95% CIs, speedup vs AR with
  its CI, accuracy, identical-to-AR share, for the drafter's arm at N = `n` (and its selector-off
  arm on the same weights where the run has one).
- **tau ratios**: for every pair of drafters at the same T (in the order given), pooled tau
  num / den over the sample ids both ran, with a paired bootstrap CI (`tau_ratio`); and each
  drafter over its own selector-off arm. Over all datasets and, where there are several, per dataset.
- **Per-position acceptance**: P(slot i accepted | slots < i accepted) at N = `n`.
- **N sweep**: tau and speedup vs N (CIs) for every run with two or more N (the `--sweep` runs
  and any compared run that has them), with the run's cost-model prediction when it made one.
- **Training**: final loss / tau proxies and held-out values from the distillation run's
  `metrics.jsonl`, and the SHA-256 of each final checkpoint file.

Figures give each drafter one colour in every plot (`drafter_colours`) and its own name; a
drafter's selector-off arm keeps the colour with a dashed line. Integer axes (N, slot) have
integer ticks.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dflash2.evaluation.analysis import stats
from dflash2.evaluation.analysis.stats import tau_ratio
from dflash2.evaluation.arms import drafter_kinds, kind_of, primary_kind
from dflash2.evaluation.analysis.records import Record, read_run_records
from dflash2.evaluation.analysis.report import fmt_mcnemar_p
from dflash2.jsonl import read_jsonl, to_jsonable

TRAIN_KEYS = ("loss", "loss_unary", "loss_selector", "tau_proxy", "path_tau")
KNOWN_COLOURS = {"dflash2": "#1f77b4", "conv_only": "#ff7f0e", "v1": "#2ca02c"}
PALETTE = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79")


# ------------------------------------------------------------------ the files read
# A run's records come through `records.read_run_records` (typed `Record`s, its dedupe rule); a
# distillation run's metrics through `read_training_metrics`.


def read_training_metrics(train_dir: Path) -> list[dict]:
    """The rows of a distillation run's `metrics.jsonl` (dflash2/training/metrics.py), [] if none."""
    path = Path(train_dir) / "metrics.jsonl"
    return read_jsonl(path) if path.is_file() else []


# ------------------------------------------------------------------ runs


@dataclass(frozen=True)
class ComparedRun:
    """One (eval run, temperature): `records` of that temperature, `summary` = stats.summarize of
    them, `spec_ns` the N of its drafter arms, `train_dir` the distillation run of its checkpoint
    (None when unknown), `predictions` {arm: predicted speedup} of the run's cost model."""

    label: str
    temperature: float
    path: Path
    records: list[Record]
    summary: dict
    spec_ns: tuple[int, ...]
    train_dir: Path | None
    predictions: dict


def _checkpoint_of(records: list[Record]) -> Path | None:
    paths = {r.draft_path for r in records if r.arm_kind in drafter_kinds()} - {None}
    return Path(paths.pop()) if len(paths) == 1 else None


def _predictions(run_dir: Path, temperature: float) -> dict:
    """{arm: predicted speedup} at `temperature` from the cost model in the run's summary.json."""
    path = run_dir / "summary.json"
    arms = ((json.loads(path.read_text()).get("cost_model") or {}).get("arms") or {}) if path.is_file() else {}
    out = {}
    for key, v in arms.items():
        arm, _, t = key.partition("|T=")
        if isinstance(v, dict) and (not t or float(t) == temperature):
            out[arm] = v.get("predicted_speedup")
    return out


def _named(spec: str | Path) -> tuple[str, Path]:
    """`NAME=DIR` -> (NAME, DIR); `DIR` (also an existing path with "=" in it) -> ("", DIR)."""
    text = str(spec)
    if "=" not in text or Path(text).exists():
        return "", Path(text)
    name, _, path = text.partition("=")
    return name, Path(path)


def load_run(spec: str | Path, *, n_resamples: int = 2000, seed: int = 0) -> list[ComparedRun]:
    """The `ComparedRun`s (one per temperature) of `spec` = `DIR` or `NAME=DIR`."""
    name, run_dir = _named(spec)
    records = read_run_records(run_dir)
    ckpt = _checkpoint_of(records)
    train_dir = None
    if ckpt is not None and ckpt.name == "final":
        train_dir = ckpt.parent
    label = name or (train_dir.name if train_dir else run_dir.name)
    out = []
    for t in sorted({float(r.temperature) for r in records}):
        recs = [r for r in records if float(r.temperature) == t]
        ns = tuple(sorted({int(r.num_speculative_tokens) for r in recs if r.arm_kind == primary_kind()}))
        out.append(ComparedRun(label, t, run_dir, recs, stats.summarize(recs, n_resamples=n_resamples, seed=seed),
                               ns, train_dir if train_dir and train_dir.is_dir() else None,
                               _predictions(run_dir, t)))
    return out


def _arm_at(run: ComparedRun, kind: str, n: int) -> str | None:
    """The summary arm of `kind` at N = n, or None."""
    for arm, e in run.summary["per_arm"].items():
        if e["arm_kind"] == kind and int(e["num_speculative_tokens"]) == n:
            return arm
    return None


def _variant(label: str, kind: str) -> str:
    """The drafter's name for its arm of `kind`: the name itself for the primary kind, else with
    the kind's `compare_suffix` (", selector off")."""
    return label + (kind_of(kind).compare_suffix or "")


def _compared_kinds() -> list[str]:
    """The drafter kinds a comparison shows (`compare_suffix` set), the primary one first."""
    return [k for k in drafter_kinds() if kind_of(k).compare_suffix is not None]


def _by_sample(run: ComparedRun, kind: str, n: int) -> dict[str, Record]:
    return {r.sample_id: r for r in run.records if r.arm_kind == kind and int(r.num_speculative_tokens) == n}


# ------------------------------------------------------------------ statistics computed here


def conditional_acceptance(unconditional: Sequence[float | None]) -> list[float | None]:
    """P(slot i accepted | slots < i accepted) = u_i / u_(i-1) from u_i = P(>= i accepted), u_0 = 1;
    None where no step reached slot i."""
    out, prev = [], 1.0
    for u in unconditional:
        out.append(None if u is None or not prev else float(u) / prev)
        prev = u if u is not None else 0.0
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------ cells


def _num(v, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.{digits}f}"


def _with_ci(v, ci, digits: int = 2, scale: float = 1.0) -> str:
    if v is None:
        return "-"
    cell = _num(v * scale, digits)
    if ci and ci[0] is not None and np.isfinite(ci[0]):
        cell += f" [{_num(ci[0] * scale, digits)}, {_num(ci[1] * scale, digits)}]"
    return cell


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


# ------------------------------------------------------------------ tables (each: header, rows, data)


def _drafter_arms(runs: list[ComparedRun], n: int):
    """(run, kind, arm label) of every drafter arm (DFlash2, selector-off) at N = n, run by run."""
    for run in runs:
        for kind in _compared_kinds():
            arm = _arm_at(run, kind, n)
            if arm is not None:
                yield run, kind, arm


def arms_table(runs: list[ComparedRun], n: int) -> tuple[list[str], list[list[str]], list[dict]]:
    """Per drafter (and its selector-off arm), T and dataset ("all" first) at N = n."""
    header = ["drafter", "T", "dataset", "n", "tau pooled [95% CI]", "tau per-request [95% CI]",
              "speedup vs AR [95% CI]", "accuracy % [95% CI]", "McNemar b / c", "McNemar p", "MDE (pp)",
              "identical to AR %"]
    rows, data = [], []
    for run, kind, arm in _drafter_arms(runs, n):
        entry = run.summary["per_arm"][arm]
        for ds, m in [("all", entry["overall"])] + sorted(entry["by_dataset"].items()):
            rows.append([_variant(run.label, kind), f"{run.temperature:g}", ds, str(m.get("n", 0)),
                         _with_ci(m.get("tau_pooled"), m.get("tau_pooled_ci")),
                         _with_ci(m.get("tau_per_request"), m.get("tau_per_request_ci")),
                         _with_ci(m.get("speedup"), m.get("speedup_ci")),
                         _with_ci(m.get("accuracy"), m.get("accuracy_ci"), 1, 100) if m.get("n_scored") else "-",
                         _discordant(m.get("mcnemar")), fmt_mcnemar_p(m.get("mcnemar")),
                         _num(100 * m["mde_accuracy"], 1) if _finite(m.get("mde_accuracy")) else "-",
                         _num(100 * m["identical_fraction"], 1) if m.get("identical_fraction") is not None
                         else "-"])
            data.append({"drafter": run.label, "arm": arm, "kind": kind, "T": run.temperature, "dataset": ds,
                         **{k: m.get(k) for k in ("n", "tau_pooled", "tau_pooled_ci", "tau_per_request",
                                                   "tau_per_request_ci", "speedup", "speedup_ci", "accuracy",
                                                   "accuracy_ci", "identical_fraction")},
                         "mcnemar_p": (m.get("mcnemar") or {}).get("p"),
                         "mcnemar_b": (m.get("mcnemar") or {}).get("b_only_arm_correct"),
                         "mcnemar_c": (m.get("mcnemar") or {}).get("c_only_ar_correct"),
                         "mde_accuracy": m.get("mde_accuracy")})
    return header, rows, data


def _discordant(mcnemar: dict | None) -> str:
    """"b / c": samples only the arm solved / only AR solved (McNemar's discordant pairs)."""
    if not mcnemar:
        return "-"
    return f"{mcnemar['b_only_arm_correct']} / {mcnemar['c_only_ar_correct']}"


def _finite(v) -> bool:
    return v is not None and bool(np.isfinite(v))


def _of_dataset(by_sample: dict[str, Record], dataset: str) -> dict[str, Record]:
    """The records of `dataset` ("all": every record)."""
    return by_sample if dataset == "all" else {s: r for s, r in by_sample.items() if r.dataset == dataset}


def ratio_table(runs: list[ComparedRun], n: int, n_resamples: int, seed: int) -> tuple[list, list, list[dict]]:
    """Pooled-tau ratios: every pair of drafters at the same T (order given), and each drafter over
    its selector-off arm in the same run; over all common samples ("all") and, when the runs hold
    more than one dataset, over each dataset's common samples."""
    header = ["ratio", "T", "dataset", "common samples", "tau num", "tau den", "ratio [95% CI]", "CI excludes 1"]
    pairs, p = [], primary_kind()
    for i, a in enumerate(runs):
        pairs += [(a, p, b, p) for b in runs[i + 1:] if b.temperature == a.temperature]
    for k in _compared_kinds()[1:]:  # each ablation of the same weights, under its primary arm
        pairs += [(a, p, a, k) for a in runs if _arm_at(a, k, n)]
    rows, data = [], []
    for a, ka, b, kb in pairs:
        num, den = _by_sample(a, ka, n), _by_sample(b, kb, n)
        if not num or not den:
            continue
        datasets = sorted({r.dataset for r in num.values()} & {r.dataset for r in den.values()})
        for ds in ["all"] + (datasets if len(datasets) > 1 else []):
            r = tau_ratio(_of_dataset(num, ds), _of_dataset(den, ds), n_resamples, seed)
            name = f"{_variant(a.label, ka)} / {_variant(b.label, kb)}"
            ci = r["ratio_ci"]
            excl = "-" if not ci or not np.isfinite(ci[0]) else ("yes" if ci[0] > 1 or ci[1] < 1 else "no")
            rows.append([name, f"{a.temperature:g}", ds, str(r["n"]), _num(r["tau_num"], 3), _num(r["tau_den"], 3),
                         _with_ci(r["ratio"], ci, 3), excl])
            data.append({"name": name, "numerator": a.label, "denominator": _variant(b.label, kb),
                         "T": a.temperature, "dataset": ds, "colour_of": a.label, **r})
    return header, rows, data


def position_table(runs: list[ComparedRun], n: int) -> tuple[list, list, list[dict]]:
    """Conditional per-position acceptance at N = n per drafter arm and T."""
    header = ["drafter", "T"] + [f"slot {i}" for i in range(1, n + 1)]
    rows, data = [], []
    for run, kind, arm in _drafter_arms(runs, n):
        cond = conditional_acceptance(run.summary["per_arm"][arm]["overall"]["per_position_acceptance"])
        rows.append([_variant(run.label, kind), f"{run.temperature:g}"] + [_num(c, 3) for c in cond])
        data.append({"drafter": run.label, "kind": kind, "T": run.temperature, "conditional": cond})
    return header, rows, data


def sweep_table(runs: list[ComparedRun]) -> tuple[list, list, list[dict]]:
    """tau and speedup vs N for every run with two or more N, with the run's predicted speedup."""
    header = ["drafter", "T", "N", "tau pooled [95% CI]", "speedup vs AR [95% CI]", "predicted speedup"]
    rows, data = [], []
    for run in runs:
        if len(run.spec_ns) < 2:
            continue
        for n in run.spec_ns:
            arm = _arm_at(run, primary_kind(), n)
            o = run.summary["per_arm"][arm]["overall"]
            pred = run.predictions.get(arm)
            rows.append([run.label, f"{run.temperature:g}", str(n),
                         _with_ci(o.get("tau_pooled"), o.get("tau_pooled_ci")),
                         _with_ci(o.get("speedup"), o.get("speedup_ci")), _num(pred)])
            data.append({"drafter": run.label, "T": run.temperature, "N": n, "tau": o.get("tau_pooled"),
                         "tau_ci": o.get("tau_pooled_ci"), "speedup": o.get("speedup"),
                         "speedup_ci": o.get("speedup_ci"), "predicted": pred})
    return header, rows, data


def training_table(train: dict[str, Path]) -> tuple[list, list, dict[str, list[dict]], list]:
    """Final training values per drafter, the per-step rows, and the checkpoint SHA-256 rows."""
    metrics = {name: read_training_metrics(d) for name, d in train.items()}
    evals = sorted({k for rows in metrics.values() for r in rows for k in r if k.startswith("eval/")})
    header = ["drafter", "steps"] + [f"final {k}" for k in TRAIN_KEYS + tuple(evals)]
    rows, shas = [], []
    for name, rs in metrics.items():
        steps = [r for r in rs if "loss" in r]
        last = lambda k: next((r[k] for r in reversed(rs) if isinstance(r.get(k), (int, float))), None)  # noqa: E731
        rows.append([name, str(steps[-1]["step"]) if steps else "-"]
                    + [_num(last(k), 4 if k.startswith("loss") else 3) for k in TRAIN_KEYS + tuple(evals)])
        for f in sorted((train[name] / "final").glob("*.safetensors")):
            shas.append([name, f.name, _sha256(f)])
    return header, rows, metrics, shas


# ------------------------------------------------------------------ figures


def drafter_colours(names: Sequence[str]) -> dict[str, str]:
    """One colour per drafter name, used by every figure of a comparison: dflash2, conv_only and v1
    always get the same colours; other names take the next unused palette colours in sorted order."""
    out = {n: KNOWN_COLOURS[n] for n in names if n in KNOWN_COLOURS}
    free = [c for c in PALETTE if c not in out.values()]
    for i, n in enumerate(sorted(set(names) - set(out))):
        out[n] = free[i % len(free)]
    return out


def _style(kind: str) -> dict:
    primary = kind == primary_kind()
    return {"linestyle": "-" if primary else "--", "marker": "o" if primary else "s"}


def _errs(vals: list, cis: list):
    if any(c is None or c[0] is None for c in cis):
        return None
    return [[v - c[0] for v, c in zip(vals, cis)], [c[1] - v for v, c in zip(vals, cis)]]


def _temps_axes(plt, temps: list[float], title: str, width: float = 5.0):
    fig, axes = plt.subplots(1, max(len(temps), 1), figsize=(width * max(len(temps), 1), 4.0), dpi=100,
                             squeeze=False)
    fig.suptitle(title)
    return fig, dict(zip(temps, axes[0]))


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _figures(arms: list[dict], ratios: list[dict], positions: list[dict], sweep: list[dict],
             metrics: dict[str, list[dict]], colours: dict[str, str], n: int, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = {}
    temps = sorted({a["T"] for a in arms})
    fig, axes = _temps_axes(plt, temps, f"pooled tau at N={n} (95% CI, incl. bonus)")
    for t, ax in axes.items():
        pts = [a for a in arms if a["T"] == t and a["dataset"] == "all"]
        for x, a in enumerate(pts):
            ax.errorbar([x], [a["tau_pooled"]], yerr=_errs([a["tau_pooled"]], [a["tau_pooled_ci"]]), capsize=4,
                        color=colours[a["drafter"]], **{**_style(a["kind"]), "linestyle": "none"})
        ax.set_xticks(range(len(pts)), [_variant(a["drafter"], a["kind"]) for a in pts], rotation=20, fontsize=8)
        ax.set_title(f"T={t:g}")
        ax.set_ylabel("tau pooled")
        ax.grid(alpha=0.3, axis="y")
    figs["tau"] = fig

    ratios = [r for r in ratios if r["dataset"] == "all"]   # the per-dataset rows are in the table
    fig, ax = plt.subplots(figsize=(7.0, 0.35 * max(len(ratios), 3) + 1.2), dpi=100)
    for y, r in enumerate(reversed(ratios)):
        if r["ratio"] is not None:
            ci = r["ratio_ci"]
            xerr = [[r["ratio"] - ci[0]], [ci[1] - r["ratio"]]] if ci and np.isfinite(ci[0]) else None
            ax.errorbar([r["ratio"]], [y], xerr=xerr, capsize=3, marker="o", color=colours[r["colour_of"]])
    ax.set_yticks(range(len(ratios)), [f"{r['name']}, T={r['T']:g}" for r in reversed(ratios)], fontsize=8)
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xlabel("ratio of pooled tau (paired bootstrap 95% CI); colour: numerator")
    ax.grid(alpha=0.3, axis="x")
    figs["tau_ratio"] = fig

    fig, axes = _temps_axes(plt, temps, f"conditional per-position acceptance, N={n}")
    for t, ax in axes.items():
        for p in positions:
            if p["T"] == t:
                pos = [i for i, c in enumerate(p["conditional"], start=1) if c is not None]
                ax.plot(pos, [p["conditional"][i - 1] for i in pos], color=colours[p["drafter"]],
                        label=_variant(p["drafter"], p["kind"]), **_style(p["kind"]))
        ax.set(title=f"T={t:g}", xlabel="draft slot i", ylabel="P(slot i accepted | slots < i accepted)",
               ylim=(0, 1.02))
        ax.set_xticks(range(1, n + 1))
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    figs["per_position"] = fig

    if sweep:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.4, 4.0), dpi=100)
        for key in sorted({(p["drafter"], p["T"]) for p in sweep}):
            pts = sorted((p for p in sweep if (p["drafter"], p["T"]) == key), key=lambda p: p["N"])
            c, lab = colours[key[0]], f"{key[0]}, T={key[1]:g}"
            for ax, k in ((a1, "tau"), (a2, "speedup")):
                ok = [p for p in pts if p[k] is not None]
                ax.errorbar([p["N"] for p in ok], [p[k] for p in ok], yerr=_errs([p[k] for p in ok],
                            [p[f"{k}_ci"] for p in ok]), color=c, marker="o", capsize=3, label=lab)
            pred = [p for p in pts if p["predicted"] is not None]
            if pred:
                a2.plot([p["N"] for p in pred], [p["predicted"] for p in pred], color=c, linestyle=":", marker="^",
                        label=f"{lab}, cost model")
        a2.axhline(1.0, color="grey", linestyle=":")
        for ax, lab in ((a1, "tau pooled (incl. bonus)"), (a2, "speedup vs AR (wall time)")):
            ax.set(xlabel="num_speculative_tokens N", ylabel=lab)
            _integer_ticks(ax)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("N sweep (95% CIs)")
        figs["sweep"] = fig

    if metrics:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10.4, 4.0), dpi=100)
        for name, rows in metrics.items():
            for ax, key, ls in ((a1, "loss", "-"), (a2, "tau_proxy", "-"), (a2, "eval/tau_real", ":")):
                pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
                if pts:
                    ax.plot(*zip(*pts), color=colours[name], linestyle=ls, marker="." if len(pts) < 50 else None,
                            label=f"{name} {key}")
        for ax, title in ((a1, "training loss"), (a2, "tau proxy (train) and held-out engine tau")):
            ax.set(xlabel="optimizer step", title=title)
            _integer_ticks(ax)
            ax.grid(alpha=0.3)
            if ax.has_data():
                ax.legend(fontsize=8)
        figs["training"] = fig

    paths = {}
    out.mkdir(parents=True, exist_ok=True)
    for name, fig in figs.items():
        fig.tight_layout()
        paths[name] = out / f"{name}.png"
        fig.savefig(paths[name], format="png")
        plt.close(fig)
    return paths


# ------------------------------------------------------------------ the comparison


def _common_n(runs: list[ComparedRun]) -> int:
    common = set.intersection(*(set(r.spec_ns) for r in runs))
    if not common:
        raise ValueError("the compared runs share no num_speculative_tokens: "
                         + "; ".join(f"{r.path} has {list(r.spec_ns)}" for r in runs) + " (pass --n)")
    return max(common)


def compare_runs(runs: Sequence[str | Path], out_dir: str | Path, *, sweeps: Sequence[str | Path] = (),
                 train: Sequence[str | Path] | None = None, n: int | None = None, n_resamples: int = 2000,
                 seed: int = 0) -> dict:
    """Compare evaluation runs and write `out_dir/compare.md`, `compare.json` and `figures/*.png`.

    Args:
        runs: eval run directories (`DIR` or `NAME=DIR`), one drafter per run; each (drafter, T)
            at most once. Tables list dflash2, conv_only, v1 first, then the others as given.
        sweeps: more eval runs used only for the N sweep (e.g. one drafter at many N).
        train: distillation run directories (`DIR` or `NAME=DIR`) for the training table and
            curves; None = those that wrote the compared checkpoints (found from the records).
        n: num_speculative_tokens of the compared arms; None = the largest N every run has.
        n_resamples, seed: bootstrap settings for every CI.
    Returns:
        {"markdown", "json", "figures": {name: path}, "n", "arms", "ratios", "positions", "sweep",
        "training"} with the numbers of the tables (JSON-ready).
    Raises:
        FileNotFoundError / ValueError with one line naming the run when a run is missing,
        empty, duplicated, or the runs share no N.
    """
    if not runs:
        raise ValueError("--compare needs at least one run directory")
    compared = [r for spec in runs for r in load_run(spec, n_resamples=n_resamples, seed=seed)]
    order: dict[str, int] = {}
    for name in list(KNOWN_COLOURS) + [r.label for r in compared]:
        order.setdefault(name, len(order))
    compared.sort(key=lambda r: (order[r.label], r.temperature))  # dflash2, conv_only, v1, then as given
    seen: dict[tuple, Path] = {}
    for r in compared:
        if (r.label, r.temperature) in seen:
            raise ValueError(f"two runs of drafter {r.label!r} at T={r.temperature:g}: {seen[r.label, r.temperature]} "
                             f"and {r.path}; compare one of them, or name them NAME=DIR")
        seen[r.label, r.temperature] = r.path
    n = _common_n(compared) if n is None else int(n)
    if n < 1 or not any(n in r.spec_ns for r in compared):
        raise ValueError(f"--n {n}: no compared run has a drafter arm at N={n}")
    sweep_runs = compared + [r for spec in sweeps for r in load_run(spec, n_resamples=n_resamples, seed=seed)]
    if train is None:
        train_dirs = {r.label: r.train_dir for r in compared if r.train_dir is not None}
    else:
        train_dirs = {}
        for spec in train:
            name, path = _named(spec)
            if not path.is_dir():
                raise FileNotFoundError(f"--train {path}: not a directory")
            train_dirs[name or path.name] = path
    colours = drafter_colours([r.label for r in sweep_runs] + list(train_dirs))

    out = Path(out_dir)
    a_head, a_rows, arms = arms_table(compared, n)
    r_head, r_rows, ratios = ratio_table(compared, n, n_resamples, seed)
    p_head, p_rows, positions = position_table(compared, n)
    s_head, s_rows, sweep = sweep_table(sweep_runs)
    t_head, t_rows, metrics, shas = training_table(train_dirs)
    figs = _figures(arms, ratios, positions, sweep, {k: v for k, v in metrics.items() if v}, colours, n,
                    out / "figures")
    rel = lambda p: Path(os.path.relpath(p, out)).as_posix()  # noqa: E731
    md = ["<!-- written by dflash2.evaluation.analysis.compare (python eval/report.py --compare) -->",
          "# Comparison of drafters", "",
          "Runs: " + ", ".join(f"`{r.label}` T={r.temperature:g} (`{r.path}`)" for r in compared) + ".", "",
          f"tau includes the bonus token: pooled = sum(accepted + 1) / steps, per request = mean of each sample's "
          f"mean(accepted + 1). 95% percentile bootstrap CIs over samples ({n_resamples} resamples, seed {seed}); "
          "speedup CIs resample the timed generation batches; accuracy: Wilson. Every number is recomputed "
          "from the runs' records.jsonl.", "",
          f"## Drafters at N={n}", "", markdown_table(a_head, a_rows), "", f"![tau]({rel(figs['tau'])})", "",
          "## tau ratios (paired over common samples)", "", markdown_table(r_head, r_rows), "",
          f"![tau ratios]({rel(figs['tau_ratio'])})", "",
          "## Conditional per-position acceptance", "", markdown_table(p_head, p_rows), "",
          f"![per-position acceptance]({rel(figs['per_position'])})", ""]
    if sweep:
        md += ["## N sweep", "", markdown_table(s_head, s_rows), "", f"![N sweep]({rel(figs['sweep'])})", ""]
    if train_dirs:
        md += ["## Training", "", markdown_table(t_head, t_rows), ""]
        md += ([markdown_table(["drafter", "file", "SHA-256"], shas), ""] if shas else [])
        md += [f"![training curves]({rel(figs['training'])})", ""] if "training" in figs else []
    (out / "compare.md").write_text("\n".join(md))
    result = {"n": n, "arms": arms, "ratios": ratios, "positions": positions, "sweep": sweep,
              "training": {k: {"dir": str(train_dirs[k]), "rows": len(v)} for k, v in metrics.items()},
              "checkpoints": [{"drafter": d, "file": f, "sha256": h} for d, f, h in shas],
              "colours": colours}
    (out / "compare.json").write_text(json.dumps(to_jsonable(result), indent=2))
    return {**result, "markdown": out / "compare.md", "json": out / "compare.json", "figures": figs}
