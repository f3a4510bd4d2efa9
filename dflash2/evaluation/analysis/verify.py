"""Verify policies in the analyses: per-depth acceptance, verify rows per step, the series over
verify rows, and the step-cost pricing of the adaptive and tree arms (issue 43, "Evaluation").

Read from the records' verify fields (`records.Record`: `verify_policy`, `tree_budget`,
`verify_lengths`, `verify_rows`; `records.verify_of` fills them in for records written before
them, which ran the chain at length N). Definitions, also stated in the summary's conventions:

- **Per-depth acceptance** at depth d = 1..N: P(depth d accepted | depth d - 1 accepted and the
  step could accept depth d), pooled over the arm's steps: among the steps with `accepted >= d - 1`
  whose cap reaches d, the fraction with `accepted >= d`. A step's cap is its verify length
  (chain and tree: N; adaptive: its L, so only steps with L >= d count at depth d), and for a tree
  also `tree_budget - 1` (a tree of B nodes holds no node deeper than B - 1). For the chain it is
  the conditional acceptance `a_d` of `acceptance.py`; a tree's depth d is accepted when its
  accepted path reaches depth d on any branch. None where no step reached depth d - 1 with a
  cap of d or more (`depth_acceptance_steps` holds the denominators).
- **Verify rows per step**: the mean over the arm's steps (pooled) of the rows a verify of each
  step's own length scores (`verify_rows`: chain N + 1, adaptive L + 1, tree B, AR 1);
  **forward rows per step**: what its target forward scores today (`arms.forward_rows`: adaptive
  still N + 1). The two differ for adaptive only.
- **Pricing** (`price_policy_arm`): an adaptive or tree step is the drafter's chain step with
  another verify, so the chain kind's fitted step-cost model `c(B, N, ctx)`, whose N + 1 are the
  rows its forward scores, prices it at `rows - 1`: `c(B, forward_rows - 1, ctx)`, and for
  adaptive also at its mean ragged rows (what a ragged verify would cost). Its tokens per step
  are its measured tau (no profile predicts a tree's or a length schedule's acceptance), so
  these predictions test the step cost alone; a tree step's extra work (building the tree and
  its mask, moving K/V) shows as measured above predicted. In exact mode a tree step runs a second,
  chain forward that confirms its path, priced here as one forward of the summed rows (a
  warning says so).

Public: `depth_acceptance`, `verify_metrics`, `arm_policy`, `series_key`, `vs_rows`, `price_policy_arm`,
`CONVENTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dflash2.engine.stats import tau_pooled
from dflash2.evaluation.analysis.records import Record, verify_of
from dflash2.evaluation.arms import kind_of

CONVENTIONS = {
    "depth_acceptance": "depth d = P(depth d accepted | depth d - 1 accepted and the step's verify length >= d; "
                        "a tree also needs d <= budget - 1), pooled over steps",
    "verify_rows_per_step": "mean over steps of the rows a verify of the step's own length scores (chain N + 1, "
                            "adaptive L + 1, tree budget, AR 1); forward_rows_per_step: the rows today's forward "
                            "scores (adaptive N + 1)",
}


def _caps(rec: Record, v: dict) -> list[int]:
    """Per step, the deepest depth the step could accept (module docstring)."""
    if v["policy"] == "tree" and v["tree_budget"] is not None:
        return [min(int(n), int(v["tree_budget"]) - 1) for n in v["lengths"]]
    return [int(n) for n in v["lengths"]]


def depth_acceptance(recs: Sequence[Record], n: int) -> dict[str, list]:
    """Per-depth acceptance of `recs` (one arm's records, N = `n`; module docstring).

    Returns:
        `{"depth_acceptance": [n] floats or None, "depth_acceptance_steps": [n] ints}`: at depth d,
        the conditional rate and the steps it is computed over.
    """
    reached, hits = [0] * n, [0] * n
    for r in recs:
        caps = _caps(r, verify_of(r))
        for a, cap in zip(r.accepted, caps):
            a = int(a)
            for d in range(1, min(a + 1, cap, n) + 1):  # depths d with accepted >= d - 1 and cap >= d
                reached[d - 1] += 1
                hits[d - 1] += a >= d
    return {"depth_acceptance": [h / s if s else None for h, s in zip(hits, reached)],
            "depth_acceptance_steps": reached}


def verify_metrics(recs: Sequence[Record], n: int) -> dict[str, Any]:
    """An arm's verify figures for the summary: `verify_rows_per_step`, `forward_rows_per_step`,
    `verify_length_mean` (None without steps) and the per-depth acceptance (`depth_acceptance`)."""
    steps = rows = fwd = length = 0
    for r in recs:
        v = verify_of(r)
        steps += int(r.steps)
        rows += sum(v["rows"])
        fwd += v["forward_rows"] * int(r.steps)
        length += sum(int(x) for x in v["lengths"])
    out: dict[str, Any] = {"verify_rows_per_step": rows / steps if steps else None,
                           "forward_rows_per_step": fwd / steps if steps else None,
                           "verify_length_mean": length / steps if steps else None}
    out.update(depth_acceptance(recs, n))
    return out


def arm_policy(recs: Sequence[Record]) -> dict[str, Any]:
    """`{"verify_policy", "tree_budget"}` of one arm's records (the first record's; an arm has one)."""
    v = verify_of(recs[0])
    return {"verify_policy": v["policy"], "tree_budget": v["tree_budget"]}


def series_key(arm: str, arm_kind: str) -> str:
    """The series an arm belongs to over verify rows: its kind's family (every budget of a tree
    kind on one line), with the label's `|T=...` suffix in a run of several temperatures."""
    _, bar, t = arm.partition("|")
    return kind_of(arm_kind).family + (bar + t if bar else "")


def vs_rows(arms: Sequence[str], per_arm: dict) -> dict[str, dict]:
    """Per series (`series_key`) of the drafter's arms (kinds that `uses_draft`), ordered by verify
    rows: `arm_kind`, `verify_policy`, and per arm `arms`, `N`, `tree_budget`, `verify_rows`
    (mean per step), `forward_rows`, `tau_pooled(_ci)`, `speedup(_ci)`. The plot of tau and speedup
    over verify rows reads it (chain and tree series as lines, adaptive as points)."""
    keys = ("arms", "N", "tree_budget", "verify_rows", "forward_rows", "tau_pooled", "tau_pooled_ci", "speedup",
            "speedup_ci")
    series: dict[str, dict] = {}
    for arm in arms:
        e = per_arm[arm]
        o = e["overall"]
        if not kind_of(e["arm_kind"]).uses_draft or o.get("verify_rows_per_step") is None:
            continue
        s = series.setdefault(series_key(arm, e["arm_kind"]), {"arm_kind": e["arm_kind"],
                                                                "verify_policy": e.get("verify_policy"),
                                                                **{k: [] for k in keys}})
        values = {"arms": arm, "N": e["num_speculative_tokens"], "tree_budget": e.get("tree_budget"),
                  "verify_rows": o["verify_rows_per_step"], "forward_rows": o["forward_rows_per_step"]}
        values.update({k: o.get(k) for k in ("tau_pooled", "tau_pooled_ci", "speedup", "speedup_ci")})
        for k in keys:
            s[k].append(values[k])
    for s in series.values():
        order = sorted(range(len(s["arms"])), key=lambda i: (s["verify_rows"][i], s["arms"][i]))
        for k in keys:
            s[k] = [s[k][i] for i in order]
    return series


def price_policy_arm(recs: Sequence[Record], *, step_s: Callable[[float], float], ar_step_s: float,
                     wall: Callable[[float, dict[str, float]], float], ar_wall: float, sample_ids: Sequence[str],
                     batch: int, calibrated_rows: tuple[int, int]) -> dict[str, Any]:
    """The cost model's prediction for one adaptive or tree arm (module docstring, "Pricing").

    Args:
        recs: the arm's records (one temperature).
        step_s: rows -> seconds per step of the chain kind's fitted model at the run's batch and
            context (`c(B, rows - 1, ctx)`).
        ar_step_s: that model's AR step (`c(B, 0, ctx)`).
        wall: `(seconds per step, {sample_id: tokens per step}) -> predicted wall` over the AR
            arm's generations (`cost._from_records_at`); `ar_wall`: its value for the AR arm.
        sample_ids: the AR arm's samples (each gets this arm's measured tokens per step on it, the
            arm's pooled tau where it has no record).
        batch: the run's batch size; calibrated_rows: the forward rows the chain fit saw (min, max).
    Returns:
        `verify_policy`, `tree_budget`, `forward_rows`, `verify_rows` (mean per step), `tau_source`,
        `predicted_step_s`, `predicted_tau` (= measured), `predicted_decode_tokens_per_s`,
        `predicted_decode_speedup`, `predicted_speedup` (end to end), `warnings`, and where the
        ragged rows differ from the forward's (adaptive): `ragged_rows`, `ragged_step_s`,
        `ragged_decode_speedup`, `ragged_speedup`.
    """
    v = verify_of(recs[0])
    steps = sum(int(r.steps) for r in recs)
    rows = sum(sum(verify_of(r)["rows"]) for r in recs) / steps if steps else float(v["forward_rows"])
    tau = tau_pooled([r.accepted for r in recs])
    own = {r.sample_id: tau_pooled([r.accepted]) for r in recs if r.accepted}
    e = {sid: own.get(sid, tau) for sid in sample_ids}
    fwd = v["forward_rows"]
    lo, hi = calibrated_rows
    warn = [f"{x:.3g} verify rows outside the chain fit's {lo}..{hi}: step cost extrapolated linearly"
            for x in dict.fromkeys((float(fwd), rows)) if not lo <= x <= hi]
    exact = recs[0].exact_impl
    if exact == "rows":
        warn.append(f"exact mode (rows): every chain forward is padded to {recs[0].exact_block_size} rows, so the "
                    "chain fit's N does not measure rows: indicative only")
    elif exact is not None and v["policy"] == "tree":
        warn.append("exact mode: the tree forward and its confirming chain forward are priced as one forward of "
                    "their summed rows")
    c = step_s(fwd)
    out = {"verify_policy": v["policy"], "tree_budget": v["tree_budget"], "forward_rows": fwd, "verify_rows": rows,
           "tau_source": "measured (this arm's records): the prediction tests the step cost only",
           "predicted_step_s": c, "predicted_tau": tau, "predicted_decode_tokens_per_s": batch * tau / c,
           "predicted_decode_speedup": tau * ar_step_s / c, "predicted_speedup": ar_wall / wall(c, e),
           "warnings": warn}
    if abs(rows - fwd) > 1e-9:
        c_r = step_s(rows)
        out.update(ragged_rows=rows, ragged_step_s=c_r, ragged_decode_speedup=tau * ar_step_s / c_r,
                   ragged_speedup=ar_wall / wall(c_r, e))
    return out
