"""Cost model for speculative decoding: predict tokens/s and speedup per N, pick the best N.

Two measured ingredients, combined by one formula:

1. **Step cost** `c(B, N, ctx)` (seconds per decoding step of a batch of B rows, drafting N
   tokens, at a committed context of `ctx` tokens), a linear model fitted by weighted least
   squares, one fit per batch size B (linear interpolation in B between fitted sizes):

       c(B, N, ctx) = c0 + d*[N > 0] + c1*(N + 1) + c2*ctx + c3*ctx*(N + 1)

   `c0` (overhead): fixed per-step cost: weights read once, kernel launches, host syncs.
   `d` (draft): what only speculative steps pay (draft forward, selector); N = 0 is the AR step.
   `c1` (per_token): per verified/drafted token (matmul work beyond the memory-bound floor).
   `c2` (kv): reading the KV cache once per step (memory-bound attention).
   `c3` (attention): attention work per query token and key (compute-bound attention).
   A term enters only when the measurements identify it (its column raises the design's rank;
   the context terms also need the calibration contexts to spread by `min_ctx_spread`);
   dropped terms are listed with the reason, so a fit at one context says it cannot
   extrapolate in context rather than inventing a slope.

2. **Acceptance profile** `a_i = P(slot i accepted | slots 1..i-1 accepted)` (conditional).
   `dflash2.engine.stats.per_position_acceptance` and the eval summaries report the
   *unconditional* `u_i = P(at least i drafts accepted)`; the two are related by
   `u_i = a_1 * ... * a_i`, i.e. `a_i = u_i / u_{i-1}` (`u_0 = 1`,
   `dflash2.engine.stats.conditional_acceptance`). Then

       E[tokens/step](N) = 1 + sum_{k=1..N} prod_{i<=k} a_i  = 1 + sum_{k=1..N} u_k

   (the 1 is the bonus/corrected token; this is tau *including the bonus*, as in the stats).

The `N + 1` of the step cost are the rows the verify forward scores. Arms of the adaptive and
tree verify policies are priced by the drafter's chain fit at their own rows (`c(B, rows - 1,
ctx)`; adaptive's forward scores N + 1 today, and its ragged L + 1 is priced beside it; a tree
scores its budget) with their measured tau (`from_records` step 6, `analysis/verify.py`).

Predictions: tokens/s = B * E(N) / c(B, N, ctx); AR tokens/s = B / c(B, 0, ctx);
speedup = (E(N) / c(B, N, ctx)) / (1 / c(B, 0, ctx)) (steady-state decoding, no prefill).
`from_records` also predicts the end-to-end speedup the eval reports measure (wall time incl.
prefill), see its docstring. Whether a prediction is **in-sample** (its arm was used for
calibration) is always stated in the output.

Public: `StepCost`, `StepCostModel`, `AcceptanceProfile`, `expected_tokens_per_step`,
`Prediction`, `predict_speedup`, `best_num_speculative_tokens`, `from_records`, `for_report`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from dflash2.engine.stats import tau_pooled
from dflash2.evaluation.analysis.acceptance import AcceptanceProfile, expected_tokens_per_step
from dflash2.evaluation.arms import baseline, kind_of, primary_kind
from dflash2.evaluation.analysis.records import Record, arm_family, as_records, dedupe
from dflash2.evaluation.analysis.verify import price_policy_arm
from dflash2.jsonl import to_jsonable

TERMS = ("overhead", "draft", "per_token", "kv", "attention")
FORMULA = "c = c0 + d*[N>0] + c1*(N+1) + c2*ctx + c3*ctx*(N+1)"
CONTEXT_TERMS = ("kv", "attention")


def _design(n: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """`[M, 5]` feature columns in `TERMS` order for N `[M]` and context `[M]`."""
    n, ctx = np.asarray(n, dtype=float), np.asarray(ctx, dtype=float)
    return np.stack([np.ones_like(n), (n > 0).astype(float), n + 1, ctx, ctx * (n + 1)], axis=1)


@dataclass(frozen=True)
class StepCost:
    """One measurement: `seconds` per step at (batch, n, ctx); `weight` = steps it averages."""

    batch: int
    n: int
    ctx: float
    seconds: float
    weight: float = 1.0


@dataclass
class BatchFit:
    """The fit at one batch size: coefficients (0 for dropped terms) and residuals."""

    batch: int
    coef: dict[str, float]
    dropped: dict[str, str]
    n_points: int
    dof: int
    rms_rel_residual: float
    max_rel_residual: float
    n_values: list[int]
    ctx_range: tuple[float, float]
    residuals: list[dict] = field(default_factory=list)

    def predict(self, n, ctx) -> np.ndarray:
        x = _design(np.atleast_1d(n), np.atleast_1d(ctx))
        return x @ np.array([self.coef[t] for t in TERMS])


class StepCostModel:
    """Step cost `c(B, N, ctx)` in seconds; see the module docstring for the form.

    Build with `StepCostModel.fit(measurements)`; query with `predict(batch, n, ctx)`.
    """

    def __init__(self, fits: dict[int, BatchFit]):
        if not fits:
            raise ValueError("StepCostModel needs at least one batch size fit")
        self.fits = dict(sorted(fits.items()))

    @classmethod
    def fit(cls, measurements: Iterable[StepCost], *, min_ctx_spread: float = 0.2) -> StepCostModel:
        """Weighted non-negative least squares per batch size (sqrt(weight)-scaled rows).

        Args:
            measurements: `StepCost` rows (per step, or aggregated with `weight` = steps).
            min_ctx_spread: the context terms are fitted only when (max - min) / mean of the
                measured contexts reaches this (a narrow range gives no usable slope).
        Returns:
            the fitted model; `info()` lists coefficients, dropped terms and residuals.
        """
        by_b: dict[int, list[StepCost]] = defaultdict(list)
        for m in measurements:
            if not (m.seconds > 0 and math.isfinite(m.seconds)):
                raise ValueError(f"StepCost.seconds={m.seconds} at batch={m.batch}, n={m.n}: must be finite and > 0")
            if m.n < 0 or m.batch < 1 or m.ctx < 0 or not m.weight > 0:
                raise ValueError(f"bad StepCost {m}: need batch >= 1, n >= 0, ctx >= 0, weight > 0")
            by_b[int(m.batch)].append(m)
        return cls({b: _fit_batch(b, ms, min_ctx_spread) for b, ms in by_b.items()})

    @property
    def batches(self) -> list[int]:
        return list(self.fits)

    def predict(self, batch: int, n: int, ctx: float) -> float:
        """Seconds per step at (batch, n, ctx); linear interpolation between fitted batch sizes.

        Raises:
            ValueError: batch outside the fitted batch sizes, or a non-positive prediction.
        """
        bs = self.batches
        if batch in self.fits:
            c = float(self.fits[batch].predict(n, ctx)[0])
        elif bs[0] < batch < bs[-1]:
            hi = next(b for b in bs if b > batch)
            lo = max(b for b in bs if b < batch)
            w = (batch - lo) / (hi - lo)
            c = float((1 - w) * self.fits[lo].predict(n, ctx)[0] + w * self.fits[hi].predict(n, ctx)[0])
        else:
            raise ValueError(f"batch={batch} is outside the calibrated batch sizes {bs}; measure step costs "
                             "at that batch size (the model interpolates, never extrapolates, in B)")
        if not c > 0:
            raise ValueError(f"predicted step cost {c:.3g} s <= 0 at batch={batch}, n={n}, ctx={ctx}: the fit "
                             "extrapolates badly there; calibrate closer to that point")
        return c

    def extrapolation(self, batch: int, n: int, ctx: float) -> list[str]:
        """Warnings for a query outside what the calibration covered (empty when inside)."""
        out = []
        for b in self.batches if batch not in self.fits else [batch]:
            f = self.fits[b]
            if not min(f.n_values) <= n <= max(f.n_values):
                out.append(f"N={n} outside calibrated N {min(f.n_values)}..{max(f.n_values)} (batch {b})")
            lo, hi = f.ctx_range
            if not lo * 0.9 <= ctx <= hi * 1.1:
                how = "context terms fitted" if "kv" not in f.dropped else "context terms NOT fitted: c flat in ctx"
                out.append(f"ctx={ctx:.0f} outside calibrated {lo:.0f}..{hi:.0f} (batch {b}; {how})")
        return out

    def info(self) -> dict:
        """JSON-ready fit description: formula, per batch coefficients, dropped terms, residuals."""
        return {"formula": FORMULA, "terms": list(TERMS),
                "fits": {str(b): asdict(f) for b, f in self.fits.items()}}


def _fit_batch(batch: int, ms: list[StepCost], min_ctx_spread: float) -> BatchFit:
    n = np.array([m.n for m in ms], dtype=float)
    ctx = np.array([m.ctx for m in ms], dtype=float)
    y = np.array([m.seconds for m in ms], dtype=float)
    w = np.sqrt(np.array([m.weight for m in ms], dtype=float))
    x = _design(n, ctx)
    scaled = x / np.maximum(np.abs(x).max(axis=0), 1e-300)  # rank checks on comparable columns
    spread = (ctx.max() - ctx.min()) / max(ctx.mean(), 1e-300)
    keep: list[int] = []
    dropped: dict[str, str] = {}
    for j, term in enumerate(TERMS):
        if term in CONTEXT_TERMS and spread < min_ctx_spread:
            dropped[term] = (f"calibration contexts span {ctx.min():.0f}..{ctx.max():.0f} (spread {spread:.0%} < "
                             f"{min_ctx_spread:.0%}): no slope in ctx can be fitted")
        elif np.linalg.matrix_rank(scaled[:, keep + [j]], tol=1e-9) == len(keep) + 1:
            keep.append(j)
        else:
            dropped[term] = "not identifiable from these measurements (column in the span of the others)"
    # Non-negative least squares: every term is a cost, and noise must not buy a negative slope
    # that turns into a negative step cost when extrapolated. Columns scaled for conditioning.
    from scipy.optimize import nnls

    scale = np.maximum(np.abs(x[:, keep]).max(axis=0), 1e-300)
    beta, _ = nnls(x[:, keep] / scale * w[:, None], y * w)
    beta = beta / scale
    at_zero = [TERMS[j] for j, b in zip(keep, beta) if b == 0.0]
    coef = {t: 0.0 for t in TERMS}
    for j, b in zip(keep, beta):
        coef[TERMS[j]] = float(b)
    pred = x[:, keep] @ beta
    rel = (pred - y) / y
    wts = w**2
    residuals = [{"n": int(a), "ctx": float(c), "measured_s": float(m), "fitted_s": float(p), "rel": float(r)}
                 for a, c, m, p, r in zip(n, ctx, y, pred, rel)]
    if len(residuals) > 64:  # per-step fits: keep the report small, the summary numbers cover all
        residuals = sorted(residuals, key=lambda r: -abs(r["rel"]))[:16]
    for t in at_zero:
        dropped[t] = "fitted at its bound 0 (non-negative least squares): no measurable cost"
    return BatchFit(
        batch=batch, coef=coef, dropped=dropped, n_points=len(ms), dof=len(ms) - len(keep),
        rms_rel_residual=float(np.sqrt(np.sum(wts * rel**2) / np.sum(wts))),
        max_rel_residual=float(np.max(np.abs(rel))), n_values=sorted({int(a) for a in n}),
        ctx_range=(float(ctx.min()), float(ctx.max())), residuals=residuals)


# ------------------------------------------------------------------------------ predictions


@dataclass(frozen=True)
class Prediction:
    """Steady-state decoding prediction at (batch, n, ctx)."""

    batch: int
    n: int
    ctx: float
    step_s: float
    ar_step_s: float
    expected_tokens_per_step: float
    tokens_per_s: float
    ar_tokens_per_s: float
    speedup: float
    warnings: tuple[str, ...] = ()


def predict_speedup(model: StepCostModel, profile: AcceptanceProfile | Sequence[float], batch: int, n: int,
                    ctx: float) -> Prediction:
    """Tokens/s and speedup vs AR at (batch, n, ctx).

    Args:
        model: fitted step costs (must cover N = 0 for the AR baseline).
        profile: an `AcceptanceProfile`, or a sequence of *conditional* rates `a_i`.
        batch, n, ctx: batch size, drafted tokens per step, committed context length.
    Returns:
        `Prediction` (tokens_per_s = B * E / c(B, n, ctx); speedup = E * c(B, 0, ctx) / c(B, n, ctx)).
    """
    prof = profile if isinstance(profile, AcceptanceProfile) else AcceptanceProfile(tuple(profile))
    e = prof.expected_tokens(n)
    c, c_ar = model.predict(batch, n, ctx), model.predict(batch, 0, ctx)
    warn = model.extrapolation(batch, n, ctx) + model.extrapolation(batch, 0, ctx)
    if prof.extended_from is not None and n > prof.extended_from:
        warn.append(f"acceptance beyond position {prof.extended_from} assumed equal to the last measured rate")
    return Prediction(batch, n, float(ctx), c, c_ar, e, batch * e / c, batch / c_ar, e * c_ar / c,
                      tuple(dict.fromkeys(warn)))


def best_num_speculative_tokens(model: StepCostModel, profile: AcceptanceProfile | Sequence[float], batch: int,
                                ctx: float, candidates: Iterable[int] | None = None) -> tuple[int, list[Prediction]]:
    """The N with the highest predicted tokens/s (ties: the smaller N).

    Args:
        candidates: N values to compare (default 1..len(profile)).
    Returns:
        (best N, predictions for every candidate in increasing N).
    """
    prof = profile if isinstance(profile, AcceptanceProfile) else AcceptanceProfile(tuple(profile))
    ns = sorted(set(candidates)) if candidates is not None else list(range(1, len(prof.conditional) + 1))
    if not ns:
        raise ValueError("best_num_speculative_tokens: no candidate N")
    preds = [predict_speedup(model, prof, batch, n, ctx) for n in ns]
    best = max(preds, key=lambda p: (p.tokens_per_s, -p.n))
    return best.n, preds


# ------------------------------------------------------------------------------ records


def _generations(records: list[Record]) -> list[list[Record]]:
    """Engine calls, in file order: consecutive records of one arm sharing `wall_s` (the runner
    splits a batch's wall time evenly over its rows), at most `batch_size` of them."""
    groups: list[list[Record]] = []
    for r in records:
        g = groups[-1] if groups else None
        if (g and g[0].arm == r.arm and g[0].temperature == r.temperature
                and g[0].wall_s == r.wall_s and len(g) < int(g[0].batch_size or 1)):
            g.append(r)
        else:
            groups.append([r])
    return groups


def _gen_ctx(g: list[Record]) -> float:
    """Mean committed context over a generation's steps: prompt + half the generated tokens."""
    return float(np.mean([int(r.prompt_tokens or 0) + len(r.tokens or []) / 2 for r in g]))


def _step_costs(gens: dict[str, list[list[Record]]]) -> tuple[dict[str, float], float, dict]:
    """Stage 1: per-arm seconds per step with a shared per-generation overhead (prefill, first
    token, setup), by least squares over generations: wall_g = o + c_arm * steps_g."""
    arms = sorted(gens)
    rows, y = [], []
    for j, arm in enumerate(arms):
        for g in gens[arm]:
            x = np.zeros(1 + len(arms))
            x[0], x[1 + j] = 1.0, max(int(r.steps) for r in g)
            rows.append(x)
            y.append(sum(float(r.wall_s) for r in g))
    x, y = np.array(rows), np.array(y)
    if not np.all(y > 0):
        bad = sorted({arm for arm in arms for g in gens[arm] if sum(float(r.wall_s) for r in g) <= 0})
        raise ValueError(f"records of arms {bad} have wall_s <= 0: no step cost can be measured from them")
    note = "overhead o fitted"
    cols = list(range(x.shape[1]))
    if np.linalg.matrix_rank(x / np.maximum(np.abs(x).max(0), 1e-300), tol=1e-9) < x.shape[1]:
        cols, note = cols[1:], "overhead not identifiable (too few generations): folded into the step costs"
    beta, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
    refit = None  # why the overhead is folded into the step costs, if it is
    if cols[0] == 0 and beta[0] < 0:
        refit = f"fitted overhead {beta[0]:.3g} s < 0"
    elif cols[0] == 0 and np.any(beta[1:] <= 0):
        # Generations of (nearly) equal length, as in batches whose slowest row always reaches the
        # token cap, leave the overhead and the step costs unseparated: lstsq can trade a large
        # overhead for a negative step cost. A step costs time, so fold the overhead back in.
        neg = [arms[j] for j in range(len(arms)) if beta[1 + j] <= 0]
        refit = f"step cost of {neg} <= 0 with a fitted overhead (the generations' lengths do not separate the two)"
    if refit:
        cols, note = cols[1:], f"{refit}: refitted without it (folded into step costs)"
        beta, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
    coef = dict(zip(cols, beta))
    rel = (x[:, cols] @ beta - y) / y
    info = {"model": "wall_per_generation = o + c_arm * steps", "overhead_s": float(coef.get(0, 0.0)),
            "note": note, "generations": int(len(y)), "rms_rel_residual": float(np.sqrt(np.mean(rel**2))),
            "max_rel_residual": float(np.max(np.abs(rel)))}
    return {arm: float(coef[1 + j]) for j, arm in enumerate(arms)}, float(coef.get(0, 0.0)), info


def from_records(records: list[Record | dict], *, calibrate_arms: Iterable[str] | None = None,
                 predict_arms: Iterable[str] | None = None, min_ctx_spread: float = 0.2) -> dict:
    """Calibrate the cost model on evaluation records and predict every arm's speedup.

    Per temperature: (1) per-arm step costs from the calibration arms' generations at the run's
    batch size, `wall = o + c_arm * steps` (o: per-generation overhead shared by all arms);
    then per arm kind (spec, selector_off, oracle: their steps cost differently) with at least
    two calibrated N values: (2) `StepCostModel.fit` on (B, N, mean ctx, c_arm) of the AR arm
    (N = 0) and that kind's arms; (3) the acceptance profile of its calibration arm with the
    largest N; (4) per predicted arm: steady-state `Prediction`, and the end-to-end speedup the
    reports measure, `sum_g (o + S_g(0) c(B,0)) / sum_g (o + S_g(N) c(B,N))` over the AR arm's
    generations g, with `S_g(N) = max_rows ((tokens - 1) + (E_r - 1) / 2) / E_r(N)` expected
    steps: a batch steps until its slowest row is done, and each row r has its own E_r from its
    own acceptance profile (its record in that calibration arm; the pooled profile where it has
    none). The token after prefill is not a step; the last step overshoots by (E - 1) / 2 tokens
    on average. Each row gets its own E rather than one pooled E for every row because a batch
    steps until its slowest row is done, which a pooled E under-predicts.
    (5) `best_n` per kind: the N with the highest predicted decode tokens/s (`N`) and the N with
    the highest predicted end-to-end speedup over the AR arm's generations (`N_end_to_end`).
    (6) Arms of an adaptive or tree kind (`ArmKind.verify`) get no fit of their own: the chain fit
    of the drafter's primary kind prices their steps at the rows their forward scores (`c(B,
    rows - 1, ctx)`: N + 1 for adaptive today, the budget for a tree) with their measured tau,
    and adaptive's also at its mean ragged rows (L + 1: `ragged_*`); `verify.price_policy_arm`.

    Args:
        records: evaluation records (`dflash2.evaluation.analysis.records.Record`s or their dicts; one per
            (arm, T, sample) is kept by `records.dedupe`); `batch_size` and `prompt_tokens` are
            used when present.
        calibrate_arms: arm labels to calibrate on (default: all). Must include the AR arm.
        predict_arms: arm labels to predict (default: every arm of a kind with a profile).
        min_ctx_spread: see `StepCostModel.fit`.
    Returns:
        JSON-ready dict: `in_sample` (any predicted arm was calibrated on), `label`,
        `predictions` {arm key: predicted end-to-end speedup}, `arms` (per arm: predicted and
        measured step cost, tau, tokens/s, speedups, `in_sample`, warnings), `step_cost` (fit
        info, stage-1 residuals), `profiles`, `best_n`. Arm keys carry `|T=...` when the
        records hold several temperatures (as in `stats.summarize`).
    """
    if not records:
        raise ValueError("from_records: no records")
    kept = dedupe(as_records(records))
    temps = sorted({float(r.temperature) for r in kept})
    cal = set(calibrate_arms) if calibrate_arms is not None else None
    pred = set(predict_arms) if predict_arms is not None else None
    out: dict = {"formula": FORMULA, "arms": {}, "predictions": {}, "profiles": {}, "best_n": {},
                 "step_cost": {}, "skipped": {}, "calibrated_on": [], "predicted": []}
    for t in temps:
        recs = [r for r in kept if float(r.temperature) == t]
        key = (lambda a: f"{a}|T={t:g}") if len(temps) > 1 else (lambda a: a)
        _from_records_at(recs, t, key, cal, pred, min_ctx_spread, out)
    inside = sorted(set(out["predicted"]) & set(out["calibrated_on"]))
    out["in_sample"] = bool(inside)
    if not out["predicted"]:
        out["label"] = "nothing predicted: " + "; ".join(out["skipped"].values())
    elif inside:
        out["label"] = (f"in-sample: {len(inside)} of {len(out['predicted'])} predicted arms were also used for "
                        "calibration (their step costs are fitted to the very wall times they are compared with)")
    else:
        out["label"] = "out-of-sample: no predicted arm was used for calibration"
    return out


def _from_records_at(recs, t, key, cal, pred, min_ctx_spread, out) -> None:
    info = {r.arm: (r.arm_kind, int(r.num_speculative_tokens)) for r in recs}
    base = baseline().name
    ar_arms = [a for a, (k, _) in info.items() if k == base]
    if len(ar_arms) != 1:
        raise ValueError(f"T={t:g}: need exactly one AR arm (arm_kind {base!r}) for the N = 0 step cost, got {ar_arms}")
    ar = ar_arms[0]
    calib = [a for a in info if cal is None or a in cal or key(a) in cal]
    if ar not in calib:
        raise ValueError(f"calibrate_arms must include the AR arm {ar!r} (it gives the N = 0 step cost)")
    gens_all = _generations(recs)
    sizes = [len(g) for g in gens_all]
    batch = max(set(sizes), key=sizes.count)  # the run's batch size (a last, smaller chunk is left out)
    gens = defaultdict(list)
    for g in gens_all:
        if len(g) == batch:
            gens[g[0].arm].append(g)
    step_c, overhead, stage1 = _step_costs({a: gens[a] for a in calib if gens[a]})
    ctx = {a: float(np.average([_gen_ctx(g) for g in gens[a]], weights=[max(int(r.steps) for r in g) or 1
                                                                          for g in gens[a]])) for a in gens}
    steps = {a: sum(int(r.steps) for r in recs if r.arm == a) for a in info}
    out["step_cost"][f"T={t:g}"] = {"batch": batch, "per_arm_stage": stage1}
    out["calibrated_on"] += [key(a) for a in step_c]
    by_arm = defaultdict(list)
    for r in recs:
        by_arm[r.arm].append(r)
    ar_by_sample = {r.sample_id: r for r in by_arm[ar]}
    c_ctx, ar_gens = ctx[ar], gens[ar]

    def wall(c: float, e: dict[str, float]) -> float:
        """Predicted wall time over the AR arm's generations at c s/step, where `e[sample_id]` is
        that row's expected tokens per step: a generation lasts as many steps as its slowest row
        needs, and a row's last step overshoots what it still needs by (E - 1) / 2 tokens."""
        return sum(overhead + c * max((max(len(r.tokens or []) - 1, 0) + (e[r.sample_id] - 1) / 2)
                                      / e[r.sample_id] for r in g)
                   for g in ar_gens)

    ar_ids = {r.sample_id for g in ar_gens for r in g}

    def measured(arm: str) -> dict:
        """What the arm's records measured: step cost (stage 1), tau, speedup over AR, tokens/s."""
        pairs = [(ar_by_sample[r.sample_id], r) for r in by_arm[arm] if r.sample_id in ar_by_sample]
        w_ar, w_x = sum(float(a.wall_s) for a, _ in pairs), sum(float(x.wall_s) for _, x in pairs)
        toks, w_arm = sum(len(r.tokens or []) for r in by_arm[arm]), sum(float(r.wall_s) for r in by_arm[arm])
        return {"measured_step_s": step_c.get(arm), "measured_tau": tau_pooled([r.accepted for r in by_arm[arm]]),
                "measured_speedup": w_ar / w_x if w_x > 0 else None,
                "measured_tokens_per_s": toks / w_arm if w_arm > 0 else None}

    # One step-cost model per chain arm kind (an oracle step has no draft forward, a dflash2 step
    # has one), each fitted on the AR arm plus that kind's calibration arms; it needs two N values.
    # The adaptive and tree kinds are priced by the drafter's chain fit afterwards (`verify.py`).
    policy_kinds = {k for k, _ in info.values() if kind_of(k).verify != "chain"}
    chain = None
    for kind in sorted({k for k, _ in info.values()} - {base} - policy_kinds):
        # Keyed by the arms' own family name ("dflash2", "selector_off", "oracle"), not the kind.
        fam = f"{arm_family(next(a for a in info if info[a][0] == kind))}|T={t:g}"
        arms = [a for a in step_c if info[a][0] == kind]
        cal_n = sorted({info[a][1] for a in arms})
        if len(cal_n) < 2:
            out["skipped"][fam] = (f"calibration has N = {cal_n} only: the step cost's dependence on N cannot be "
                                   "fitted from fewer than two N values")
            continue
        model = StepCostModel.fit([StepCost(batch, info[a][1], ctx[a], step_c[a], weight=max(steps[a], 1))
                                   for a in [ar] + arms], min_ctx_spread=min_ctx_spread)
        out["step_cost"][fam] = model.info()
        top = max(arms, key=lambda a: info[a][1])
        prof = AcceptanceProfile.from_accepted([r.accepted for r in by_arm[top]], info[top][1], source=key(top))
        out["profiles"][fam] = {"source": prof.source, "conditional": list(prof.conditional),
                                "unconditional": prof.unconditional}
        row_prof = {r.sample_id: AcceptanceProfile.from_accepted([r.accepted], info[top][1])
                    for r in by_arm[top] if r.accepted}

        def e_rows(n: int) -> dict[str, float]:
            """sample_id -> that row's expected tokens per step at N = n: its own profile, else the
            pooled one (1 for the AR step)."""
            if n == 0:
                return dict.fromkeys(ar_ids, 1.0)
            pooled = prof.extended(n).expected_tokens(n)
            return {sid: row_prof[sid].extended(n).expected_tokens(n) if sid in row_prof else pooled
                    for sid in ar_ids}

        ar_wall = wall(model.predict(batch, 0, c_ctx), e_rows(0))
        if kind == primary_kind():
            chain = (model, fam, ar_wall, cal_n)
        targets = [a for a, (k, _) in info.items() if k == kind or (k == base and key(a) not in out["arms"])]
        for arm in sorted(targets, key=lambda a: info[a][1]):
            if pred is not None and arm not in pred and key(arm) not in pred:
                continue
            n = info[arm][1]
            p = predict_speedup(model, prof.extended(n), batch, n, c_ctx)
            e = p.expected_tokens_per_step
            e2e = ar_wall / wall(p.step_s, e_rows(n))
            k = key(arm)
            out["arms"][k] = {
                "arm_kind": info[arm][0], "N": n, "model": fam, "batch": batch, "ctx": c_ctx,
                "in_sample": arm in step_c, "forward_rows": n + 1, "predicted_step_s": p.step_s,
                "predicted_tau": e, "predicted_decode_tokens_per_s": p.tokens_per_s,
                "predicted_decode_speedup": p.speedup, "predicted_speedup": e2e, **measured(arm),
                "warnings": list(p.warnings)}
            out["predicted"].append(k)
            if n > 0:
                out["predictions"][k] = e2e
        best, preds = best_num_speculative_tokens(model, prof, batch, c_ctx)
        e2e_by_n = {q.n: ar_wall / wall(q.step_s, e_rows(q.n)) for q in preds}
        out["best_n"][fam] = {
            "N": best, "batch": batch, "ctx": c_ctx, "calibrated_N": cal_n,
            "predicted_decode_tokens_per_s": {str(q.n): q.tokens_per_s for q in preds},
            "N_end_to_end": max(e2e_by_n, key=lambda n: (e2e_by_n[n], -n)),
            "predicted_end_to_end_speedup": {str(n): v for n, v in e2e_by_n.items()},
            "note": ("within the calibrated N range" if cal_n[0] <= best <= cal_n[-1] else
                     f"outside the calibrated N range {cal_n[0]}..{cal_n[-1]}: step cost extrapolated linearly")}

    policy = [a for a in sorted(info, key=lambda a: (info[a], a)) if info[a][0] in policy_kinds
              and (pred is None or a in pred or key(a) in pred)]
    if policy and chain is None:
        out["skipped"][f"verify policies|T={t:g}"] = (
            f"{', '.join(policy)}: priced by the chain fit of the {primary_kind()!r} arms, which needs two of their "
            "N values calibrated")
    elif policy:
        model, fam, ar_wall, cal_n = chain
        for arm in policy:
            entry = price_policy_arm(by_arm[arm], step_s=lambda rows: model.predict(batch, rows - 1, c_ctx),
                                     ar_step_s=model.predict(batch, 0, c_ctx), wall=wall, ar_wall=ar_wall,
                                     sample_ids=sorted(ar_ids), batch=batch, calibrated_rows=(1, max(cal_n) + 1))
            k = key(arm)
            out["arms"][k] = {"arm_kind": info[arm][0], "N": info[arm][1], "model": fam, "batch": batch, "ctx": c_ctx,
                              "in_sample": arm in step_c, **entry, **measured(arm)}
            out["predicted"].append(k)
            out["predictions"][k] = entry["predicted_speedup"]


def for_report(records: list[Record | dict]) -> tuple[dict, dict[str, float] | None]:
    """The cost model for an evaluation summary, or why there is none.

    Applies only when some temperature has an AR arm plus at least two N values of one
    speculative arm kind. Never raises: an error is returned in the dict (the summary and
    report of a long run must not be lost to the cost model).

    Returns:
        (summary["cost_model"] dict with a human `note`, predictions {arm: speedup} or None).
    """
    records = as_records(records)
    kinds: dict[tuple, set] = defaultdict(set)
    for r in records:
        kinds[(float(r.temperature), r.arm_kind)].add(int(r.num_speculative_tokens))
    base = baseline().name
    ok = any(k != base and len(ns) >= 2 and (t, base) in kinds for (t, k), ns in kinds.items())
    if not ok:
        return {"skipped": "needs an AR arm plus at least two N values of one speculative arm kind"}, None
    try:
        res = from_records(records)
    except Exception as e:  # noqa: BLE001  (reported in the summary, never fatal for the run)
        return {"error": f"{type(e).__name__}: {e}"}, None
    parts = [f"{a} {v['predicted_speedup']:.2f}/{v['measured_speedup']:.2f}" for a, v in res["arms"].items()
             if v["arm_kind"] != base and v["measured_speedup"] is not None]
    best = ", ".join(f"{k}: N={v['N']}" for k, v in res["best_n"].items())
    best_e2e = ", ".join(f"{k}: N={v['N_end_to_end']}" for k, v in res["best_n"].items())
    res["note"] = (f"cost model ({'in-sample' if res['in_sample'] else 'out-of-sample'}): predicted/measured "
                   f"speedup {', '.join(parts)}; best N by predicted decode tokens/s: {best}; "
                   f"by predicted end-to-end speedup: {best_e2e}")
    return res, res["predictions"] or None


def add_to_summary(summary: dict, records: list[Record | dict]) -> dict[str, float] | None:
    """`summary["cost_model"] = for_report(records)[0]` (JSON-safe) and its one-line verdict
    appended to `summary["notes"]` (shown in the report).

    Returns:
        arm -> predicted speedup for `report.write_report(..., predictions=)`, or None.
    """
    info, predictions = for_report(records)
    summary["cost_model"] = to_jsonable(info)
    if "note" in info:
        summary.setdefault("notes", []).append(info["note"])
    elif "error" in info:
        summary.setdefault("notes", []).append(f"cost model not computed: {info['error']}")
    return predictions


__all__ = ["add_to_summary", "AcceptanceProfile", "BatchFit", "FORMULA", "Prediction", "StepCost", "StepCostModel",
           "TERMS", "best_num_speculative_tokens", "expected_tokens_per_step", "for_report", "from_records",
           "predict_speedup"]
