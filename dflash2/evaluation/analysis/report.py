"""Reports from a summary (`dflash2.evaluation.analysis.stats.summarize`) and its records.

- `print_summary(summary)`: the terminal table (one row per arm, then per dataset), then the
  runner's own sections when the summary has them: one line per arm with its end-to-end ms per
  token and speedup (`end_to_end`), and the engine settings the arms ran under (`engine`); the
  report shows both as tables (`run_sections.py`).
- `write_report(out_dir, records, summary, config=None, predictions=None)`: `DIR/report.html`
  (self-contained: PNG plots embedded as base64) and `DIR/report.md` (the same tables; its
  plots are written to `DIR/plots/*.png` and linked, since Markdown viewers rarely show
  inline data URIs).
- `make_figures(summary, predictions=None)`: the matplotlib figures (Agg backend), shared with
  the W&B logger: tau vs N, speedup vs N (95% CIs as error bars), per-position acceptance,
  accepted-length histogram, tau per dataset, tau and speedup against verify rows per step when
  an arm ran adaptive or tree verify (chain N a line, adaptive points, tree budgets a line), and
  predicted vs measured speedup when a cost model's `predictions` (arm -> predicted speedup) are
  given. The same runs get the verify-policy table (`verify_rows`, `VERIFY_COLUMNS`).
- `arm_colours(arms)`: the one colour of each arm in every figure (a hue per arm family, a
  shade per N within it); every series is labelled with the arms' own names from the records
  (`stats.arm_family` for the series over N). Integer axes (N, draft position, accepted
  length) get integer ticks.

Public: `print_summary`, `write_report`, `make_figures`, `figure_png`, `arm_colours`,
`summary_rows`, `COLUMNS`, `verify_rows`, `VERIFY_COLUMNS`,
`has_verify_policies`, and, re-exported from
`formatting.py` (which has them, free of matplotlib), the cell formatters `fmt_value`, `fmt_ci`,
`fmt_p`, `fmt_pct`, `fmt_mcnemar_p`, `md_table` (shared with cross-run comparison reports).
"""

from __future__ import annotations

import base64
import html
import io
import json
import sys
from pathlib import Path
from typing import TextIO

import matplotlib

matplotlib.use("Agg")  # files only; never a GUI backend (headless servers, tests)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dflash2.evaluation.analysis.formatting import (  # noqa: E402, F401  (the formatters are re-exported)
    drop_empty, fmt_ci, fmt_mcnemar_p, fmt_p, fmt_pct, fmt_tost_accuracy_p, fmt_value, md_table)
from dflash2.evaluation.analysis.run_sections import (  # noqa: E402
    E2E_COLUMNS, E2E_SCOPE, ENGINE_COLUMNS, e2e_where, end_to_end_lines, end_to_end_rows, engine_lines, engine_rows,
    warmup_note)
from dflash2.evaluation.analysis.stats import arm_family  # noqa: E402

COLUMNS = ["arm", "N", "n", "tau pooled [95% CI]", "tau per-request [95% CI]", "speedup [95% CI]", "tok/s",
           "accuracy % [95% CI]", "McNemar p", "TOST acc p", "MDE pts", "identical %", "TOST logprob p"]


def _row(arm: str, n_spec: int, m: dict) -> list[str]:
    mc = m.get("mcnemar") or {}
    mde = m.get("mde_accuracy")
    return [
        arm, str(n_spec), str(m.get("n", 0)),
        fmt_ci(m.get("tau_pooled"), m.get("tau_pooled_ci")),
        fmt_ci(m.get("tau_per_request"), m.get("tau_per_request_ci")),
        fmt_ci(m.get("speedup"), m.get("speedup_ci")),
        fmt_value(m.get("tokens_per_s"), 1),
        fmt_pct(m.get("accuracy"), m.get("accuracy_ci")) if m.get("n_scored") else "-",
        fmt_mcnemar_p(mc),
        fmt_tost_accuracy_p(m),
        fmt_value(100 * mde, 1) if mde is not None else "-",
        fmt_pct(m.get("identical_fraction")),
        fmt_p(m.get("tost_logprob_p")),
    ]


def summary_rows(summary: dict, dataset: str | None = None) -> list[list[str]]:
    """Formatted table rows (see `COLUMNS`), overall or for one dataset."""
    rows = []
    for arm in summary["arms"]:
        e = summary["per_arm"][arm]
        m = e["overall"] if dataset is None else e["by_dataset"].get(dataset)
        if m:
            rows.append(_row(arm, e["num_speculative_tokens"], m))
    return rows


VERIFY_COLUMNS = ["arm", "verify", "N", "tree budget", "verify rows/step", "forward rows/step", "mean verify length",
                  "tau pooled [95% CI]", "tau / best chain [95% CI]", "speedup [95% CI]",
                  "per-depth acceptance d = 1.."]


def has_verify_policies(summary: dict) -> bool:
    """Whether some arm ran a verify policy other than the chain (adaptive, tree)."""
    return any(e.get("verify_policy") not in (None, "chain") for e in summary["per_arm"].values())


def verify_rows(summary: dict) -> list[list[str]]:
    """Formatted rows (see `VERIFY_COLUMNS`), one per arm: its policy, the mean verify rows per step
    (adaptive: its ragged L + 1) and forward rows per step, tau with its CI and its ratio over
    the best chain arm's (`stats.tau_ratio`, paired CI), speedup with its CI, and the per-depth
    acceptance (`analysis/verify.py`)."""
    rows = []
    for arm in summary["arms"]:
        e = summary["per_arm"][arm]
        o = e["overall"]
        depth = " ".join("-" if v is None else f"{v:.2f}" for v in o.get("depth_acceptance") or []) or "-"
        budget = e.get("tree_budget")
        vs = e.get("vs_best_chain")
        ratio = "-" if not vs else f"{fmt_ci(vs.get('ratio'), vs.get('ratio_ci'), 3)} ({vs['chain']})"
        rows.append([arm, e.get("verify_policy") or "-", str(e["num_speculative_tokens"]),
                     "-" if budget is None else str(budget), fmt_value(o.get("verify_rows_per_step")),
                     fmt_value(o.get("forward_rows_per_step")), fmt_value(o.get("verify_length_mean")),
                     fmt_ci(o.get("tau_pooled"), o.get("tau_pooled_ci")), ratio,
                     fmt_ci(o.get("speedup"), o.get("speedup_ci")), depth])
    return rows


def identity_line(summary: dict) -> str | None:
    """One sentence on losslessness for the report's header: at T = 0, how many speculative records
    were bit-identical to the AR arm and how many departed, and whether exact mode was on (its width);
    at T > 0, that outputs follow the target's law and are not compared token by token. None when the
    summary has no identity check (no speculative arm)."""
    ident = summary.get("checks", {}).get("identical_to_ar")
    if not ident or not ident.get("records"):
        return None
    temps = summary.get("temperatures", [])
    width, impl = summary.get("exact_block_size"), summary.get("exact_impl")
    # rows pads every forward to the width; invariant runs each block at its own width, the
    # attention's query tile fixed by it.
    shape = f"attention tile {width} queries" if impl == "invariant" else f"every forward {width} wide"
    mode = f"exact mode on ({shape}, exact_impl {impl})" if summary.get("exact") else "exact mode off"
    if any(float(t) > 0 for t in temps):
        return (f"Sampled (T = {', '.join(f'{t:g}' for t in temps)}): outputs follow the target's distribution "
                f"and are not compared token by token; {mode}.")
    n, bad = int(ident["records"]), int(ident.get("n_differing", 0))
    verdict = ("all bit-identical to the AR arm" if bad == 0
               else f"{n - bad} bit-identical to the AR arm, {bad} departed")
    tail = "" if bad == 0 or summary.get("exact") else " (bf16 near-ties flip without exact mode; see the departures)"
    return f"Greedy: {n} speculative records, {verdict}; {mode}{tail}."


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    header, rows = drop_empty(header, rows)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = "  ".join("-" * w for w in widths)
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(header), line, *map(fmt, rows)])


def print_summary(summary: dict, file: TextIO | None = None) -> None:
    """Print the terminal summary: overall table, one table per dataset, the verify-policy table
    (when an arm ran adaptive or tree verify), one end-to-end line per arm (when the summary has
    the runner's `end_to_end`), the engine settings the arms ran under (the runner's `engine`),
    then the notes."""
    out = file or sys.stdout
    temps = ", ".join(f"{t:g}" for t in summary.get("temperatures", []))
    print(f"\n{summary['n_samples']} samples ({', '.join(summary['datasets'])}), T = {temps}; "
          "tau includes the bonus token", file=out)
    line = identity_line(summary)
    if line:
        print(line, file=out)
    print(_text_table(COLUMNS, summary_rows(summary)), file=out)
    if len(summary["datasets"]) > 1:
        for ds in summary["datasets"]:
            print(f"\n[{ds}]", file=out)
            print(_text_table(COLUMNS, summary_rows(summary, ds)), file=out)
    if has_verify_policies(summary):
        print("\nverify policies (rows per step: what a verify of the step's own length scores):", file=out)
        print(_text_table(VERIFY_COLUMNS, verify_rows(summary)), file=out)
    for line in end_to_end_lines(summary) + engine_lines(summary):
        print(line, file=out)
    for note in summary.get("notes", []):
        print(f"note: {note}", file=out)


# ------------------------------------------------------------------------------ figures


AR_COLOUR = (0.45, 0.45, 0.45)
# tab10 without its grey (the AR arm's): one hue per arm family, in order of first appearance.
FAMILY_HUES = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 7]


def arm_colours(arms: list[str]) -> dict[str, tuple[float, float, float]]:
    """The colour of every arm and every arm family (`stats.arm_family`) in every figure.

    Each family gets one hue (families in order of first appearance in `arms`; the AR arm grey);
    its arms get shades of it, lighter for arms listed earlier (smaller N), the last one the
    full hue, which is also the family's own colour (its line in the plots over N).

    Returns:
        {arm or family name: RGB}, covering every entry of `arms` and of their families.
    """
    fams: dict[str, list[str]] = {}
    for arm in arms:
        fams.setdefault(arm_family(arm), []).append(arm)
    out: dict[str, tuple[float, float, float]] = {}
    hues = iter(FAMILY_HUES * (len(fams) // len(FAMILY_HUES) + 1))
    for fam, members in fams.items():
        base = AR_COLOUR if all(a == "ar" or a.startswith("ar|") for a in members) else to_rgb(next(hues))
        out[fam] = base
        for j, arm in enumerate(members):
            light = 0.55 * (len(members) - 1 - j) / max(len(members) - 1, 1)  # 0 for the last member
            out[arm] = tuple(c + (1.0 - c) * light for c in base)
    return out


def _err(values: list, cis: list) -> tuple[list, list] | None:
    """Asymmetric error bars from CIs (None where a CI is missing)."""
    if not cis or any(c is None or c[0] is None for c in cis):
        return None
    return [v - c[0] for v, c in zip(values, cis)], [c[1] - v for v, c in zip(values, cis)]


def _axes(title: str, xlabel: str, ylabel: str, integer_x: bool, size=(6.4, 4.2)):
    """A new figure and its axes, titled and labelled; `integer_x`: ticks only at integers."""
    fig, ax = plt.subplots(figsize=size, dpi=100)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return fig, ax


def _finish(fig: Figure, ax, grid_axis: str = "both") -> Figure:
    ax.grid(alpha=0.3, axis=grid_axis)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _vs_n_figure(summary: dict, key: str, ylabel: str, title: str, baseline: float) -> Figure:
    """One series per arm family over N: a line in the family's colour through points (with
    CIs) in each arm's colour; tau also as per-request (dashed, squares)."""
    colours = arm_colours(summary["arms"])
    fig, ax = _axes(title, "num_speculative_tokens N", ylabel, integer_x=True)
    keys = [key, "tau_per_request"] if key == "tau_pooled" else [key]
    series = [(fam, k) for fam in summary["vs_n"] for k in keys]
    all_n: set[int] = set()
    for j, (fam, k) in enumerate(series):
        s = summary["vs_n"][fam]
        pts = [(a, n, v, c) for a, n, v, c in zip(s["arms"], s["N"], s[k], s[f"{k}_ci"]) if v is not None]
        if not pts:
            continue
        arms, ns, vs, cs = zip(*pts)
        all_n.update(ns)
        dodge = (j - (len(series) - 1) / 2) * 0.06  # series sharing an N stay visible side by side
        per_request = k == "tau_per_request"
        xs = [n + dodge for n in ns]
        ax.plot(xs, vs, linestyle="--" if per_request else "-", color=colours.get(fam, AR_COLOUR),
                alpha=0.75 if per_request else 1.0, label=f"{fam} ({k.replace('_', ' ')})")
        err = _err(list(vs), list(cs))
        for i, arm in enumerate(arms):
            ax.errorbar([xs[i]], [vs[i]], yerr=None if err is None else ([err[0][i]], [err[1][i]]),
                        marker="s" if per_request else "o", linestyle="none", capsize=4,
                        color=colours.get(arm, AR_COLOUR))
    if all_n:
        ax.set_xticks(sorted(all_n))
        ax.set_xlim(min(all_n) - 0.6, max(all_n) + 0.6)
    ax.axhline(baseline, color=AR_COLOUR, linewidth=1, linestyle=":", label="ar")
    return _finish(fig, ax)


def _spec_arms(summary: dict) -> list[str]:
    return [a for a in summary["arms"] if summary["per_arm"][a]["num_speculative_tokens"] > 0]


def _position_figure(summary: dict) -> Figure:
    colours = arm_colours(summary["arms"])
    fig, ax = _axes("Per-position acceptance (pooled over steps, 95% CI)", "draft position i",
                    "fraction of steps accepting >= i drafts", integer_x=True)
    for arm in _spec_arms(summary):
        o = summary["per_arm"][arm]["overall"]
        vals = o["per_position_acceptance"]
        if not vals or vals[0] is None:
            continue
        pos = list(range(1, len(vals) + 1))
        ax.errorbar(pos, vals, yerr=_err(vals, o.get("per_position_acceptance_ci")), marker="o", capsize=3,
                    label=arm, color=colours[arm])
    ax.set_ylim(0, 1.02)
    return _finish(fig, ax)


def _bars(ax, arms: list[str], n_groups: int, values, colours: dict, cis=None) -> None:
    """Grouped bars: group g holds one bar per arm (`values(arm)[g]`, error bars from `cis(arm)`)."""
    width = 0.8 / max(len(arms), 1)
    for j, arm in enumerate(arms):
        vals = values(arm)
        xs = [g + (j - (len(arms) - 1) / 2) * width for g in range(n_groups)]
        ax.bar(xs, vals, width=width, yerr=_err(vals, cis(arm)) if cis else None, capsize=3, label=arm,
               color=colours[arm])


def _histogram_figure(summary: dict) -> Figure:
    arms = _spec_arms(summary)
    fig, ax = _axes("Accepted-length histogram", "accepted draft tokens per step", "fraction of steps",
                    integer_x=True)
    n_max = max((len(summary["per_arm"][a]["overall"]["accepted_length_histogram"]) for a in arms), default=1)

    def fractions(arm: str) -> list[float]:
        hist = summary["per_arm"][arm]["overall"]["accepted_length_histogram"]
        return [h / (sum(hist) or 1) for h in hist] + [0.0] * (n_max - len(hist))

    _bars(ax, arms, n_max, fractions, arm_colours(summary["arms"]))
    ax.set_xticks(range(n_max))
    return _finish(fig, ax, "y")


def _dataset_figure(summary: dict) -> Figure:
    arms, dss = _spec_arms(summary), summary["datasets"]
    fig, ax = _axes("tau per dataset (95% CI)", "", "tau pooled (incl. bonus)", integer_x=False)

    def taus(arm: str) -> list[float]:
        return [summary["per_arm"][arm]["by_dataset"].get(ds, {}).get("tau_pooled") or 0.0 for ds in dss]

    def cis(arm: str) -> list:
        bd = summary["per_arm"][arm]["by_dataset"]
        return [bd.get(ds, {}).get("tau_pooled_ci") or (v, v) for v, ds in zip(taus(arm), dss)]

    _bars(ax, arms, len(dss), taus, arm_colours(summary["arms"]), cis)
    ax.set_xticks(range(len(dss)), dss)
    return _finish(fig, ax, "y")


def _prediction_figure(summary: dict, predictions: dict[str, float]) -> Figure:
    colours = arm_colours(summary["arms"])
    fig, ax = _axes("Predicted vs measured speedup", "predicted speedup (cost model)",
                    "measured speedup (95% CI)", integer_x=False, size=(5.2, 5.0))
    pts = []
    for arm, pred in predictions.items():
        o = summary["per_arm"].get(arm, {}).get("overall", {})
        if o.get("speedup") is not None:
            pts.append((arm, float(pred), o["speedup"], o.get("speedup_ci")))
    for arm, pred, meas, ci in pts:
        ax.errorbar([pred], [meas], yerr=_err([meas], [ci]), marker="o", capsize=4, label=arm,
                    color=colours.get(arm, AR_COLOUR))
    if pts:
        lo = min(min(p[1], p[2]) for p in pts) * 0.9
        hi = max(max(p[1], p[2]) for p in pts) * 1.1
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle=":", label="measured = predicted")
    return _finish(fig, ax)


def _verify_rows_figure(summary: dict) -> Figure:
    """tau (left) and wall-clock speedup (right) against verify rows per step, one series per kind of
    the drafter's arms (`summary["vs_rows"]`): chain and tree as lines through their N or budgets,
    adaptive as points at its mean L + 1 (its forward scores N + 1 today); 95% CIs as error bars."""
    colours = arm_colours(summary["arms"])
    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.2), dpi=100)
    for ax, key, ylabel in ((axes[0], "tau_pooled", "tau pooled (incl. bonus)"),
                            (axes[1], "speedup", "speedup vs AR (wall time)")):
        for fam, s in summary.get("vs_rows", {}).items():
            pts = [(a, x, v, c, n, b) for a, x, v, c, n, b in zip(s["arms"], s["verify_rows"], s[key], s[f"{key}_ci"],
                                                                  s["N"], s["tree_budget"]) if v is not None]
            if not pts:
                continue
            arms, xs, vs, cs, ns, bs = zip(*pts)
            adaptive = s.get("verify_policy") == "adaptive"
            # the family's colour of the other plots; a tree's budgets (families there) take its largest's
            colour = colours.get(fam, colours.get(arms[-1], AR_COLOUR))
            if not adaptive:
                ax.plot(xs, vs, color=colour, linewidth=1.2)
            err = _err(list(vs), list(cs))
            label = f"{fam} ({s.get('verify_policy')})"
            for i in range(len(arms)):
                ax.errorbar([xs[i]], [vs[i]], yerr=None if err is None else ([err[0][i]], [err[1][i]]),
                            marker="D" if adaptive else "o", linestyle="none", capsize=4, color=colour,
                            label=label if i == 0 else None)
                ax.annotate(f"B={bs[i]}" if bs[i] is not None else f"N={ns[i]}", (xs[i], vs[i]), fontsize=7,
                            textcoords="offset points", xytext=(4, 4))
        ax.axhline(1.0, color=AR_COLOUR, linewidth=1, linestyle=":", label="ar")
        ax.set_xlabel("verify rows per step (chain N + 1, adaptive mean L + 1, tree budget)")
        ax.set_ylabel(ylabel)
        _finish(fig, ax)
    axes[0].set_title("tau vs verify rows per step (95% CI)")
    axes[1].set_title("Speedup vs verify rows per step (95% CI)")
    fig.tight_layout()
    return fig


def make_figures(summary: dict, predictions: dict[str, float] | None = None) -> dict[str, Figure]:
    """Named matplotlib figures for the summary (caller closes them: `plt.close(fig)`)."""
    figs: dict[str, Figure] = {}
    if summary["vs_n"]:
        figs["tau_vs_n"] = _vs_n_figure(summary, "tau_pooled", "tau (incl. bonus)",
                                        "tau vs N (pooled and per-request, 95% CI)", 1.0)
        figs["speedup_vs_n"] = _vs_n_figure(summary, "speedup", "speedup vs AR (wall time)",
                                            "Speedup vs N (paired bootstrap 95% CI)", 1.0)
    if _spec_arms(summary):
        figs["per_position_acceptance"] = _position_figure(summary)
        figs["accepted_length_histogram"] = _histogram_figure(summary)
        if len(summary["datasets"]) > 1:
            figs["tau_by_dataset"] = _dataset_figure(summary)
    if has_verify_policies(summary) and summary.get("vs_rows"):
        figs["tau_speedup_vs_verify_rows"] = _verify_rows_figure(summary)
    if predictions:
        figs["predicted_vs_measured_speedup"] = _prediction_figure(summary, predictions)
    return figs


def figure_png(fig: Figure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


# ------------------------------------------------------------------------------ documents


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    header, rows = drop_empty(header, rows)
    th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _sections(summary: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table in the report."""
    out = [("All datasets", COLUMNS, summary_rows(summary))]
    if len(summary["datasets"]) > 1:
        out += [(f"Dataset: {ds}", COLUMNS, summary_rows(summary, ds)) for ds in summary["datasets"]]
    if has_verify_policies(summary):
        out.append(("Verify policies (rows per step: what a verify of the step's own length scores; forward rows: "
                    "what today's forward scores)", VERIFY_COLUMNS, verify_rows(summary)))
    cat_rows = []
    for arm in summary["arms"]:
        for cat, m in summary["per_arm"][arm].get("by_category", {}).items():
            cat_rows.append([arm, cat, fmt_ci(m.get("tau_pooled"), m.get("tau_pooled_ci")),
                             fmt_ci(m.get("tau_per_request"), m.get("tau_per_request_ci")), str(m.get("steps_total"))])
    if cat_rows:
        out.append(("tau per MT-Bench category", ["arm", "category", "tau pooled [95% CI]",
                                                  "tau per-request [95% CI]", "steps"], cat_rows))
    disc, deps = [], []
    for arm in summary["arms"]:
        o = summary["per_arm"][arm]["overall"]
        d = (o.get("mcnemar") or {}).get("discordant") or {}
        disc += [[arm, sid, "arm only"] for sid in d.get("only_arm_correct", [])]
        disc += [[arm, sid, "AR only"] for sid in d.get("only_ar_correct", [])]
        deps += [[arm, x["sample_id"], str(x.get("position")), fmt_value(x.get("margin"), 4)]
                 for x in o.get("departures", [])]
    checks = summary.get("checks") or {}
    check_rows = [[k, {True: "passed", False: "FAILED"}.get(v.get("passed"), "-") if isinstance(v, dict) else "-",
                   json.dumps(v, default=str)[:300]] for k, v in checks.items()]
    if check_rows:  # added by the runner (eval/run.py) beside the statistics
        out.insert(0, ("Run checks", ["check", "result", "details"], check_rows))
    e2e = summary.get("end_to_end")
    if e2e and e2e.get("per_arm"):  # added by the runner too: this process's timed chunks
        out.append((f"End to end per arm ({e2e_where(e2e)}: {E2E_SCOPE}; "
                    f"{e2e.get('samples', 0)} samples timed, resumed records not timed{warmup_note(e2e)})", E2E_COLUMNS,
                    end_to_end_rows(summary)))
    if summary.get("engine"):  # added by the runner: what each arm's calls ran under
        out.append(("Engine settings per arm", ENGINE_COLUMNS, engine_rows(summary)))
    if disc:
        out.append(("Discordant correctness (McNemar)", ["arm", "sample", "correct in"], disc))
    if deps:
        out.append(("Departures from AR (greedy)", ["arm", "sample", "position", "top1-top2 logit margin"], deps))
    return out


CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
       "margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
       "th{background:#f0f0f0}img{max-width:640px;margin:6px;border:1px solid #eee}pre{background:#f7f7f7;"
       "padding:1em;overflow:auto;font-size:12px}")


def write_report(out_dir: str | Path, records: list, summary: dict, config: dict | None = None,
                 predictions: dict[str, float] | None = None) -> Path:
    """Write `out_dir/report.html` (self-contained) and `out_dir/report.md` (+ `out_dir/plots/*.png`).

    Args:
        out_dir: run directory.
        records: the run's `records.Record`s (for counts in the header; statistics come from `summary`).
        summary: `summarize(records)`.
        config: the resolved run config (shown verbatim at the end).
        predictions: optional arm -> predicted speedup from a cost model; adds the predicted vs
            measured plot.
    Returns:
        Path of `report.html`.
    """
    out = Path(out_dir)
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    figs = make_figures(summary, predictions)
    pngs: dict[str, bytes] = {}
    for name, fig in figs.items():
        pngs[name] = figure_png(fig)
        plt.close(fig)
        (plots / f"{name}.png").write_bytes(pngs[name])

    temps = ", ".join(f"{t:g}" for t in summary.get("temperatures", []))
    head = (f"{summary['n_samples']} samples, {len(records)} records, datasets: {', '.join(summary['datasets'])}; "
            f"temperature {temps}; arms: {', '.join(summary['arms'])}")
    sections = _sections(summary)
    conv = summary.get("conventions", {})
    cfg = json.dumps(config, indent=2, default=str) if config else None

    ident = identity_line(summary)
    md = ["# DFlash2 evaluation report", "", head, ""] + ([f"**{ident}**", ""] if ident else [])
    md += [f"- note: {n}" for n in summary.get("notes", [])] + [""]
    for title, header, rows in sections:
        md += [f"## {title}", "", md_table(header, rows), ""]
    md += ["## Plots", ""] + [f"![{n}](plots/{n}.png)" for n in pngs] + [""]
    md += ["## Conventions", ""] + [f"- **{k}**: {v}" for k, v in conv.items()] + [""]
    if cfg:
        md += ["## Config", "", "```json", cfg, "```", ""]
    (out / "report.md").write_text("\n".join(md))

    body = [f"<h1>DFlash2 evaluation report</h1><p>{html.escape(head)}</p>"]
    if ident:
        body.append(f"<p><b>{html.escape(ident)}</b></p>")
    if summary.get("notes"):
        body.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in summary["notes"]) + "</ul>")
    for title, header, rows in sections:
        body.append(f"<h2>{html.escape(title)}</h2>{_html_table(header, rows)}")
    body.append("<h2>Plots</h2>" + "".join(
        f'<img alt="{n}" title="{n}" src="data:image/png;base64,{base64.b64encode(b).decode()}">'
        for n, b in pngs.items()))
    body.append("<h2>Conventions</h2><ul>" + "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in conv.items()) + "</ul>")
    if cfg:
        body.append(f"<h2>Config</h2><pre>{html.escape(cfg)}</pre>")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>DFlash2 evaluation</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    path = out / "report.html"
    path.write_text(page)
    return path
