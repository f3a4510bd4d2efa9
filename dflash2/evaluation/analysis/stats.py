"""Statistics over evaluation records (`DIR/records.jsonl`) -> `DIR/summary.json`.

Everything is computed afterwards from the per-(arm, sample) records (log-first eval; their
fields: `dflash2.evaluation.analysis.records.Record`; one per (arm, T, sample): `records.dedupe`). The
point values of tau, per-position acceptance and the histogram come from
`dflash2.engine.stats` (the one implementation); this module adds their CIs and the paired
tests. The conventions, also written into every summary under `"conventions"`:

- **tau includes the bonus token** (spec 3.7 / 11.7). *Pooled* tau = sum over all steps of
  (accepted + 1) / number of steps (long requests weigh more); *per-request* tau = mean over
  samples of each sample's mean(accepted + 1) (samples without steps skipped).
- **Per-position acceptance**: for draft slot i = 1..N, the fraction of all steps (pooled)
  that accepted at least i draft tokens. Histogram: steps that accepted exactly 0..N.
- **Speedup** of arm X = total AR wall time / total X wall time over the samples both arms
  ran (paired).
- **CIs**: 95% percentile bootstrap (`scipy.stats.bootstrap`, `method="percentile"`), always
  resampling *samples* (a cluster bootstrap: a sample's steps move together), paired across
  arms where two arms are compared. Percentile rather than BCa: BCa fails on the degenerate
  resamples a lossless greedy run produces (identical outputs, zero variance).
- **Accuracy**: Wilson 95% interval; McNemar's exact test on paired correctness vs AR; TOST
  paired equivalence within +-`accuracy_margin`; minimum detectable effect (MDE) of McNemar at
  alpha 0.05 / power 0.8 (see `mcnemar_mde`). Each test's sample-size floor is recorded beside
  its p (`mcnemar_min_discordant`, `tost_min_pairs`): below it the test cannot reach p <= 0.05
  (McNemar) or its p claims more than the data show (TOST), and the reports print
  "n too small (need >= M)" instead of the p-value.
- At T > 0, TOST on the target's mean per-token log-probability of the generated text vs AR
  within +-`logprob_margin` nats/token: a distribution-level losslessness check without a scorer.
- **Verify policies** (`dflash2.evaluation.analysis.verify`): per arm its `verify_policy` and
  `tree_budget`, the mean verify rows and forward rows per step, and the per-depth acceptance
  P(depth d accepted | depth d - 1 accepted, d within the step's verify length); `vs_rows`
  holds the drafter's arms by verify rows (chain, adaptive, tree) for the plot over rows.

Public: `mcnemar_exact`, `tost_paired`, `mcnemar_min_discordant`, `tost_min_pairs`, `paired_bootstrap_ci`,
`bootstrap_ci`, `mcnemar_mde`, `acceptance`, `batch_key`, `batch_totals`, `summarize`, `conventions`,
`to_jsonable`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dflash2 import jsonl
from dflash2.engine.stats import (accepted_length_histogram, per_position_acceptance, produced_and_steps,
                                  tau_per_request_mean, tau_pooled)
from dflash2.evaluation.arms import kind_of
from dflash2.evaluation.analysis.records import Record, arm_family, as_records, dedupe
from dflash2.evaluation.analysis.verify import CONVENTIONS as VERIFY_CONVENTIONS
from dflash2.evaluation.analysis.verify import arm_policy, verify_metrics, vs_rows

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE   # the level of the paired tests


def mcnemar_min_discordant(alpha: float = ALPHA) -> int:
    """The fewest discordant pairs with which the exact McNemar test can reach p <= `alpha`.

    With d discordant pairs the smallest two-sided p the test can give is 2 * 2^-d (every pair on
    one side), so it can reject only when d >= 1 + log2(1 / alpha): 6 at alpha = 0.05. With fewer,
    p > alpha whatever the data say, and the summary marks the test as unable to speak
    (`mcnemar.n_min_discordant`; the reports print "n too small" instead of its p)."""
    return math.ceil(1 + math.log2(1 / alpha) - 1e-12)


def tost_min_pairs(margin: float, alpha: float = ALPHA) -> int:
    """The fewest pairs with which paired equivalence of two binary outcomes (correctness) within
    +-`margin` can be shown at level `alpha`, even in the most favourable case (no discordant pair).

    Equivalence needs the discordance rate bounded below `margin`; with n pairs and none discordant,
    the exact one-sided `1 - alpha` bound on that rate is 1 - alpha^(1/n) (the "rule of three",
    about 3/n at alpha = 0.05), which is below `margin` only when n >= ln(alpha) / ln(1 - margin):
    149 pairs for margin 0.02. Below it `tost_paired`'s p (0 for identical correctness, the
    t-test's zero-variance limit) claims more than the data can show, so the summary records the
    floor (`tost_accuracy_n_min`) and the reports print "n too small" instead of the p-value."""
    if not 0 < margin < 1:
        raise ValueError(f"tost_min_pairs: margin must be in (0, 1), got {margin}")
    return math.ceil(math.log(alpha) / math.log1p(-margin) - 1e-9)


# ------------------------------------------------------------------------------ tests


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts.

    Under H0 the b + c discordant pairs split Bin(b + c, 1/2); p = min(1, 2 P(X <= min(b, c))).
    Computed by statsmodels' `mcnemar(exact=True)` (which is exactly this binomial test).

    Args:
        b: pairs where only the first condition is correct (e.g. speculative right, AR wrong).
        c: pairs where only the second is correct.
    Returns:
        p-value in [0, 1]; 1.0 when there are no discordant pairs.
    """
    from statsmodels.stats.contingency_tables import mcnemar

    b, c = int(b), int(c)
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar_exact: discordant counts must be >= 0, got b={b}, c={c}")
    if b + c == 0:
        return 1.0
    # Concordant cells do not enter the exact test; zeros keep the table valid.
    return float(min(1.0, mcnemar(np.array([[0, b], [c, 0]]), exact=True).pvalue))


def tost_paired(x: Sequence[float], y: Sequence[float], margin: float) -> float:
    """Paired TOST (two one-sided t-tests) that mean(x - y) lies within (-margin, +margin).

    H0: |mean(x - y)| >= margin; a small p rejects non-equivalence (i.e. shows equivalence).
    Uses statsmodels' `ttost_paired(x, y, -margin, margin)`, whose p is the larger of the two
    one-sided p-values.

    Degenerate case (all differences equal, zero variance; e.g. a lossless greedy arm with
    identical correctness on every sample): the mean difference is known exactly, so p = 0
    when it lies strictly inside the margin and 1 otherwise.

    Args:
        x, y: paired observations, same length >= 2.
        margin: equivalence margin (> 0), in the units of x and y.
    Returns:
        p-value (nan with fewer than 2 pairs).
    """
    from statsmodels.stats.weightstats import ttost_paired

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"tost_paired: x and y must be 1-D and paired, got shapes {x.shape} and {y.shape}")
    if not margin > 0:
        raise ValueError(f"tost_paired: margin must be > 0, got {margin}")
    if x.size < 2:
        return float("nan")
    d = x - y
    if np.ptp(d) == 0:
        return 0.0 if abs(d[0]) < margin else 1.0
    return float(ttost_paired(x, y, -margin, margin)[0])


def _ci(data: tuple[np.ndarray, ...], stat: Callable, n_resamples: int, seed: int, vectorized: bool,
        paired: bool) -> tuple[float, float]:
    from scipy.stats import bootstrap

    n = len(data[0])
    if n < 2:
        return (float("nan"), float("nan"))
    res = bootstrap(data, stat, n_resamples=int(n_resamples), rng=np.random.default_rng(seed), paired=paired,
                    vectorized=vectorized, method="percentile", confidence_level=CONFIDENCE)
    ci = res.confidence_interval
    return (float(ci.low), float(ci.high))


def paired_bootstrap_ci(x: Sequence[float], y: Sequence[float], stat: Callable, n_resamples: int = 2000,
                        seed: int = 0, *, vectorized: bool = False) -> tuple[float, float]:
    """95% percentile bootstrap CI of `stat(x, y)` resampling the pairs (x_i, y_i) jointly.

    Speedup: `stat = lambda a, b: a.sum() / b.sum()` with x = AR wall times, y = arm wall
    times per sample. Deterministic for a given seed (`scipy.stats.bootstrap(paired=True,
    method="percentile")`).

    Args:
        x, y: paired per-sample values, same length.
        stat: `stat(x_res, y_res) -> float` on 1-D resampled arrays; with `vectorized=True` it
            must accept an `axis=` keyword and reduce along it (much faster).
        n_resamples: bootstrap resamples.
        seed: RNG seed.
    Returns:
        `(low, high)`; `(nan, nan)` with fewer than 2 pairs.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired_bootstrap_ci: x and y must be 1-D and paired, got {x.shape} and {y.shape}")
    return _ci((x, y), stat, n_resamples, seed, vectorized, paired=True)


def bootstrap_ci(x: Sequence[float], stat: Callable = np.mean, n_resamples: int = 2000, seed: int = 0,
                 *, vectorized: bool = True) -> tuple[float, float]:
    """95% percentile bootstrap CI of a one-sample statistic (default: the mean), resampling samples."""
    x = np.asarray(x, dtype=float)
    return _ci((x,), stat, n_resamples, seed, vectorized, paired=False)


def mcnemar_mde(n: int, discordance: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable accuracy difference of a McNemar test (normal approximation, Connor 1987).

    With n pairs and discordance rate psi = (b + c) / n, a true difference delta = p10 - p01 is
    detected with the given power when

        n = (z_{1-alpha/2} sqrt(psi) + z_{power} sqrt(psi - delta^2))^2 / delta^2,

    solved here for delta in (0, psi] (delta cannot exceed psi: every discordant pair one way).

    Args:
        n: number of paired samples.
        discordance: psi in [0, 1].
    Returns:
        delta as a fraction (0.1 = 10 accuracy points); inf when even delta = psi is not
        detectable at this n; nan when psi = 0 (no discordant pairs: nothing to size from).
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    if n <= 0 or not 0 <= discordance <= 1:
        raise ValueError(f"mcnemar_mde: need n > 0 and 0 <= discordance <= 1, got n={n}, discordance={discordance}")
    psi = float(discordance)
    if psi == 0:
        return float("nan")
    za, zb = norm.ppf(1 - alpha / 2), norm.ppf(power)

    def f(delta: float) -> float:  # increasing in delta; root = the detectable delta
        return math.sqrt(n) * delta - za * math.sqrt(psi) - zb * math.sqrt(max(psi - delta * delta, 0.0))

    if f(psi) < 0:
        return float("inf")
    return float(brentq(f, 1e-12, psi))


# ------------------------------------------------------------------------------ helpers


def _ratio(a, b, axis=-1):
    return np.sum(a, axis=axis) / np.sum(b, axis=axis)


def _mean_diff(a, b, axis=-1):
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def _unwrap_numpy(obj: Any) -> Any:
    """numpy scalars and arrays as Python values, dict keys as str, tuples as lists, recursively."""
    if isinstance(obj, dict):
        return {str(k): _unwrap_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_unwrap_numpy(v) for v in (obj.tolist() if isinstance(obj, np.ndarray) else obj)]
    return obj.item() if isinstance(obj, np.generic) else obj


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy unwrapped, tuples as lists, nan/inf as None (`dflash2.jsonl`)."""
    return jsonl.to_jsonable(_unwrap_numpy(obj))


def batch_key(rec: Record) -> tuple:
    """The generation batch a record was timed in: its `batch` field, or, for records written
    before that field existed, the (wall_s, batch_size) its batch members share exactly."""
    if rec.batch is not None:
        return ("batch", rec.rank, rec.batch)
    return ("wall", rec.rank, rec.wall_s, rec.batch_size)


def batch_totals(records: list[Record], *values: Sequence[float]) -> list[np.ndarray]:
    """Each of `values` (one number per record) summed per generation batch (`batch_key`), batches
    in order of first appearance: the units a bootstrap of timed quantities must resample."""
    keys = [batch_key(r) for r in records]
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    ids = np.array([index[k] for k in keys], dtype=np.int64)
    return [np.bincount(ids, weights=np.asarray(v, dtype=float), minlength=len(index)) for v in values]


def _arm_key(rec: Record, multi_t: bool) -> str:
    return f"{rec.arm}|T={float(rec.temperature):g}" if multi_t else rec.arm


def _sort_key(arm: str, info: dict) -> tuple:
    # Per temperature, the arm kinds in their registered order (`ArmKind.order`: AR first), then N,
    # then the tree budget.
    return (float(info["temperature"]), kind_of(info["arm_kind"]).order, info["arm_kind"],
            int(info["num_speculative_tokens"]), int(info.get("tree_budget") or 0), arm)


def acceptance(recs: list[Record], N: int, n_resamples: int = 2000, seed: int = 0,
               with_position_ci: bool = False) -> dict:
    """tau (pooled, per-request), per-position acceptance and histogram over `recs`' steps, with
    95% cluster-bootstrap CIs (requests resampled).

    Point values are `dflash2.engine.stats`'s; None where there are no steps. Returns
    `steps_total`, `tau_pooled(_ci)`, `tau_per_request(_ci)`, `per_position_acceptance` `[N]`,
    `per_position_acceptance_ci` (`[N]` of (low, high) with `with_position_ci`, else absent) and
    `accepted_length_histogram` `[N + 1]`.
    """
    accepted = [r.accepted or [] for r in recs]
    produced, steps = produced_and_steps(accepted)
    out: dict[str, Any] = {"steps_total": int(steps.sum()),
                           "accepted_length_histogram": accepted_length_histogram(accepted, N)}
    if steps.sum() == 0:
        out.update(tau_pooled=None, tau_pooled_ci=None, tau_per_request=None, tau_per_request_ci=None,
                   per_position_acceptance=[None] * N, per_position_acceptance_ci=None)
        return out
    has = steps > 0
    out["tau_pooled"] = tau_pooled(accepted)
    out["tau_pooled_ci"] = paired_bootstrap_ci(produced[has], steps[has], _ratio, n_resamples, seed,
                                               vectorized=True)
    out["tau_per_request"] = tau_per_request_mean(accepted)
    out["tau_per_request_ci"] = bootstrap_ci(produced[has] / steps[has], np.mean, n_resamples, seed)
    out["per_position_acceptance"] = per_position_acceptance(accepted, N)
    if with_position_ci:
        acc = [np.asarray(a, dtype=np.int64) for a, h in zip(accepted, has) if h]
        cis = []
        for i in range(1, N + 1):
            hits = np.array([(a >= i).sum() for a in acc], dtype=float)
            cis.append(paired_bootstrap_ci(hits, steps[has], _ratio, n_resamples, seed, vectorized=True))
        out["per_position_acceptance_ci"] = cis
    return out


def _compare(recs: list[Record], ar: dict[str, Record], temperature: float, n_resamples: int, seed: int,
             accuracy_margin: float, logprob_margin: float) -> dict:
    """Paired comparison of an arm's records with the AR records of the same samples."""
    pairs = [(r, ar[r.sample_id]) for r in recs if r.sample_id in ar]
    out: dict[str, Any] = {"n_paired": len(pairs)}
    if not pairs:
        return out
    w_ar = np.array([a.wall_s for _, a in pairs], dtype=float)
    w_x = np.array([r.wall_s for r, _ in pairs], dtype=float)
    out["wall_s_ar"] = float(w_ar.sum())
    out["speedup"] = float(w_ar.sum() / w_x.sum()) if w_x.sum() > 0 else None
    # A batch is timed as one: its rows share one wall time, so they are not independent draws.
    # Resample batches (the arm's batches; each holds the same samples as the AR batch it is paired
    # with), never rows: a row bootstrap would give a zero-width interval for a single batch.
    b_ar, b_x = batch_totals([r for r, _ in pairs], w_ar, w_x)
    out["speedup_batches"] = len(b_x)
    out["speedup_ci"] = paired_bootstrap_ci(b_ar, b_x, _ratio, n_resamples, seed, vectorized=True)

    scored = [(r, a) for r, a in pairs if r.correct is not None and a.correct is not None]
    if scored:
        x = np.array([bool(r.correct) for r, _ in scored], dtype=float)
        y = np.array([bool(a.correct) for _, a in scored], dtype=float)
        only_x = sorted(r.sample_id for (r, _), xi, yi in zip(scored, x, y) if xi and not yi)
        only_ar = sorted(r.sample_id for (r, _), xi, yi in zip(scored, x, y) if yi and not xi)
        n = len(scored)
        psi = (len(only_x) + len(only_ar)) / n
        mde = mcnemar_mde(n, psi)
        out.update(
            accuracy_diff=float(x.mean() - y.mean()),
            accuracy_diff_ci=paired_bootstrap_ci(x, y, _mean_diff, n_resamples, seed, vectorized=True),
            mcnemar={"b_only_arm_correct": len(only_x), "c_only_ar_correct": len(only_ar),
                     "p": mcnemar_exact(len(only_x), len(only_ar)), "n_min_discordant": mcnemar_min_discordant(),
                     "discordant": {"only_arm_correct": only_x, "only_ar_correct": only_ar}},
            tost_accuracy_p=tost_paired(x, y, accuracy_margin), accuracy_margin=accuracy_margin,
            tost_accuracy_n_min=tost_min_pairs(accuracy_margin),
            n_scored_paired=n, discordance=psi, mde_accuracy=mde,
        )
    ident = [r.identical_to_ar for r, _ in pairs if r.identical_to_ar is not None]
    out["identical_fraction"] = float(np.mean(ident)) if ident else None
    deps = [r for r, _ in pairs if r.departure]
    out["n_departures"] = len(deps)
    if temperature == 0:  # at T > 0 outputs depart by design; listing them says nothing
        out["departures"] = [{"sample_id": r.sample_id, **r.departure} for r in deps]
    lp = [(r.logprob_mean, a.logprob_mean) for r, a in pairs
          if r.logprob_mean is not None and a.logprob_mean is not None]
    if lp:
        lx, ly = np.array(lp, dtype=float).T
        out["logprob_diff"] = float((lx - ly).mean())
        out["logprob_diff_ci"] = paired_bootstrap_ci(lx, ly, _mean_diff, n_resamples, seed, vectorized=True)
        if temperature > 0:
            out["tost_logprob_p"] = tost_paired(lx, ly, logprob_margin)
            out["logprob_margin"] = logprob_margin
    return out


def _metrics(recs: list[Record], info: dict, ar: dict[str, Record] | None, n_resamples: int, seed: int,
             accuracy_margin: float, logprob_margin: float, with_position_ci: bool) -> dict:
    from statsmodels.stats.proportion import proportion_confint

    N = int(info["num_speculative_tokens"])
    tokens = sum(len(r.tokens or []) for r in recs)
    wall = sum(float(r.wall_s) for r in recs)
    m: dict[str, Any] = {"n": len(recs), "tokens_total": tokens, "wall_s_total": wall,
                         "tokens_per_s": tokens / wall if wall > 0 else None,
                         "finish_reasons": dict(Counter(r.finish_reason for r in recs))}
    m.update(acceptance(recs, N, n_resamples, seed, with_position_ci))
    m.update(verify_metrics(recs, N))
    lps = [r.logprob_mean for r in recs if r.logprob_mean is not None]
    m["logprob_mean"] = float(np.mean(lps)) if lps else None
    scored = [bool(r.correct) for r in recs if r.correct is not None]
    m["n_scored"] = len(scored)
    if scored:
        k = sum(scored)
        m["accuracy"] = k / len(scored)
        m["accuracy_ci"] = tuple(float(v) for v in proportion_confint(k, len(scored), alpha=1 - CONFIDENCE,
                                                                      method="wilson"))
    if kind_of(info["arm_kind"]).baseline:
        m["speedup"], m["speedup_ci"] = 1.0, (1.0, 1.0)
    elif ar:
        m.update(_compare(recs, ar, float(info["temperature"]), n_resamples, seed, accuracy_margin,
                          logprob_margin))
    return m


# ------------------------------------------------------------------------------ summary

def tau_ratio(num: dict[str, Record | dict], den: dict[str, Record | dict], n_resamples: int = 2000,
              seed: int = 0) -> dict:
    """Ratio of pooled tau, num / den, over the sample ids both ran (and that took a step in both),
    with a paired bootstrap 95% CI: each resample draws sample ids with replacement, the same ids
    for both arms, and recomputes sum(accepted + 1) / steps for each (`bootstrap_ci`).

    Args:
        num, den: {sample_id: record} of the two arms (`Record`s or their JSON dicts).
    Returns:
        {"n", "tau_num", "tau_den", "ratio", "ratio_ci"}; values None where undefined (no common
        samples; a CI needs two).
    """
    num, den = ({s: r for s, r in zip(side, as_records(side.values()))} for side in (num, den))
    ids = [s for s in num if s in den and num[s].accepted and den[s].accepted]
    out = {"n": len(ids), "tau_num": None, "tau_den": None, "ratio": None, "ratio_ci": None}
    if not ids:
        return out
    acc = [[np.asarray(side[s].accepted, dtype=float) for s in ids] for side in (num, den)]
    produced = [np.array([a.sum() + a.size for a in side]) for side in acc]  # [n] each
    steps = [np.array([a.size for a in side], dtype=float) for side in acc]
    out["tau_num"], out["tau_den"] = (float(p.sum() / s.sum()) for p, s in zip(produced, steps))
    out["ratio"] = out["tau_num"] / out["tau_den"]

    def ratio(idx: np.ndarray, axis: int = -1) -> np.ndarray:  # resampled sample indices [..., n] -> [...]
        i = idx.astype(np.int64)
        return ((produced[0][i].sum(axis) / steps[0][i].sum(axis))
                / (produced[1][i].sum(axis) / steps[1][i].sum(axis)))

    if len(ids) >= 2:
        out["ratio_ci"] = bootstrap_ci(np.arange(len(ids), dtype=float), ratio, n_resamples, seed)
    return out


def _vs_best_chain(arms: list[str], info: dict, per_arm: dict, by_arm: dict, n_resamples: int, seed: int) -> None:
    """Adds `vs_best_chain` to every adaptive or tree arm's entry: its pooled tau over the best
    chain arm's (the drafter's chain arm with the highest pooled tau at the same temperature),
    `tau_ratio` with its paired bootstrap CI, and that arm's label (`chain`). In place."""
    for arm in arms:
        if info[arm].get("verify_policy") in (None, "chain"):
            continue
        t = float(info[arm]["temperature"])
        chains = [a for a in arms if float(info[a]["temperature"]) == t and info[a].get("verify_policy") == "chain"
                  and kind_of(info[a]["arm_kind"]).uses_draft and per_arm[a]["overall"].get("tau_pooled") is not None]
        if not chains:
            continue
        best = max(chains, key=lambda a: per_arm[a]["overall"]["tau_pooled"])
        ratio = tau_ratio({r.sample_id: r for r in by_arm[arm]}, {r.sample_id: r for r in by_arm[best]},
                          n_resamples, seed)
        per_arm[arm]["vs_best_chain"] = {"chain": best, **ratio}


def summarize(records: list[Record | dict], *, n_resamples: int = 2000, seed: int = 0, accuracy_margin: float = 0.02,
              logprob_margin: float = 0.05) -> dict:
    """All statistics of a run, JSON-serializable (the content of `DIR/summary.json`).

    Args:
        records: one `records.Record` per (arm, sample) (or its JSON dict, checked here). A later
            record for the same (arm, temperature, sample_id) replaces an earlier one
            (`records.dedupe`).
        n_resamples, seed: bootstrap settings (every CI is deterministic given the seed).
        accuracy_margin: TOST equivalence margin on accuracy (0.02 = +-2 points).
        logprob_margin: TOST margin on the mean per-token log-probability (nats/token), T > 0.
    Returns:
        dict with `arms` (ordered labels), `n_samples`, `datasets`, `conventions`, `notes`,
        `per_arm[arm]` = {arm_kind, num_speculative_tokens, temperature, verify_policy, tree_budget,
        overall, by_dataset, by_category, and for adaptive and tree arms `vs_best_chain`
        (`tau_ratio` over the best chain arm at that temperature)}, `vs_n[arm family]` = per-N series (tau, speedup with
        CIs) for plots, and `vs_rows[series]` = the drafter's arms over verify rows per step
        (`verify.vs_rows`).
        Arms are labelled by `arm`, suffixed `|T=...` when the records hold several temperatures.
    """
    kept = dedupe(as_records(records))
    multi_t = len({float(r.temperature) for r in kept}) > 1
    by_arm: dict[str, list[dict]] = defaultdict(list)
    info: dict[str, dict] = {}
    for r in kept:
        arm = _arm_key(r, multi_t)
        by_arm[arm].append(r)
        info.setdefault(arm, {k: getattr(r, k) for k in ("arm_kind", "num_speculative_tokens", "temperature")})
    for arm, recs in by_arm.items():
        info[arm].update(arm_policy(recs))
    arms = sorted(by_arm, key=lambda a: _sort_key(a, info[a]))
    ar_of_t = {float(info[a]["temperature"]): {r.sample_id: r for r in by_arm[a]}
               for a in arms if kind_of(info[a]["arm_kind"]).baseline}
    datasets = sorted({r.dataset for r in kept})
    notes: list[str] = []
    kw = dict(n_resamples=n_resamples, seed=seed, accuracy_margin=accuracy_margin, logprob_margin=logprob_margin)

    per_arm: dict[str, Any] = {}
    for arm in arms:
        recs = by_arm[arm]
        ar = ar_of_t.get(float(info[arm]["temperature"]))
        if ar is None and not kind_of(info[arm]["arm_kind"]).baseline:
            notes.append(f"{arm}: no AR arm at T={info[arm]['temperature']:g}; no speedup or paired tests")
        entry = dict(info[arm], overall=_metrics(recs, info[arm], ar, with_position_ci=True, **kw))
        entry["by_dataset"] = {
            ds: _metrics([r for r in recs if r.dataset == ds], info[arm], ar, with_position_ci=False, **kw)
            for ds in datasets if any(r.dataset == ds for r in recs)}
        cats: dict[str, list[dict]] = defaultdict(list)
        for r in recs:
            if r.category:
                cats[r.category].append(r)
        entry["by_category"] = {c: acceptance(v, int(info[arm]["num_speculative_tokens"]), n_resamples, seed,
                                              False) for c, v in sorted(cats.items())}
        per_arm[arm] = entry
        notes.extend(_arm_notes(arm, entry["overall"]))
    _vs_best_chain(arms, info, per_arm, by_arm, n_resamples, seed)

    return to_jsonable({
        "arms": arms, "n_samples": len({r.sample_id for r in kept}), "datasets": datasets,
        "temperatures": sorted({float(r.temperature) for r in kept}),
        "n_records": len(kept),
        "conventions": conventions(n_resamples, seed, accuracy_margin, logprob_margin,
                                   {a: e["overall"]["speedup_batches"] for a, e in per_arm.items()
                                    if "speedup_batches" in e["overall"]}),
        "settings": {"n_resamples": n_resamples, "seed": seed, "accuracy_margin": accuracy_margin,
                     "logprob_margin": logprob_margin},  # what re-summarizing the records needs
        "per_arm": per_arm, "vs_n": _vs_n(arms, per_arm), "vs_rows": vs_rows(arms, per_arm), "notes": notes,
    })


def _arm_notes(arm: str, m: dict) -> list[str]:
    notes = []
    if "mde_accuracy" in m:
        mde, n, psi = m["mde_accuracy"], m["n_scored_paired"], m["discordance"]
        if isinstance(mde, float) and math.isnan(mde):
            notes.append(f"{arm}: no discordant correctness pairs among {n} scored samples: accuracy equals AR's "
                         "on these samples (McNemar has nothing to test)")
        elif math.isinf(mde):
            notes.append(f"{arm}: with {n} scored samples and discordance {psi:.1%}, no accuracy difference is "
                         "detectable by McNemar (alpha 0.05, power 0.8); a non-significant p means little")
        else:
            notes.append(f"{arm}: McNemar minimum detectable effect {mde * 100:.1f} accuracy points (n={n}, "
                         f"discordance {psi:.1%}, alpha 0.05, power 0.8); smaller differences go undetected")
    return notes


def _vs_n(arms: list[str], per_arm: dict) -> dict:
    """Per arm family (`arm_family`: "dflash2", "selector_off", "oracle", with `|T=...` when the
    run has several temperatures), the series over N used by the vs-N plots."""
    series: dict[str, dict] = {}
    for arm in arms:
        e = per_arm[arm]
        if kind_of(e["arm_kind"]).baseline:
            continue
        s = series.setdefault(arm_family(arm), {k: [] for k in ("arms", "N", "tau_pooled", "tau_pooled_ci",
                                                                "tau_per_request", "tau_per_request_ci", "speedup",
                                                                "speedup_ci")})
        s["arm_kind"] = e["arm_kind"]
        o = e["overall"]
        s["arms"].append(arm)
        s["N"].append(e["num_speculative_tokens"])
        for k in ("tau_pooled", "tau_pooled_ci", "tau_per_request", "tau_per_request_ci", "speedup", "speedup_ci"):
            s[k].append(o.get(k))
    return series


def conventions(n_resamples: int, seed: int, accuracy_margin: float, logprob_margin: float,
                speedup_batches: dict[str, int] | None = None) -> dict[str, str]:
    """The statistics' conventions as sentences with this run's numbers (summary["conventions"]).

    Args:
        speedup_batches: arm -> generation batches its speedup CI resampled (stated per arm).
    """
    batches = ", ".join(f"{a}: {k}" for a, k in (speedup_batches or {}).items())
    return {
        "tau_pooled": "sum over steps of (accepted + 1) / steps; includes the bonus token (spec 3.7/11.7)",
        "tau_per_request": "mean over samples of each sample's mean(accepted + 1); includes the bonus token",
        "per_position_acceptance": "position i = fraction of all steps that accepted >= i draft tokens",
        "accepted_length_histogram": "number of steps that accepted exactly 0..N draft tokens",
        "speedup": "total AR wall time / total arm wall time over the samples both ran (paired); its CI "
                   "resamples generation batches, the unit that is timed"
                   + (f" (batches per arm: {batches})" if batches else ""),
        "ci": f"95% percentile bootstrap over samples (cluster; paired across arms), {n_resamples} resamples, "
              f"seed {seed}; accuracy: Wilson interval",
        "mcnemar": "exact two-sided binomial test on the discordant pairs (b = only arm correct, "
                   "c = only AR correct)",
        "tost_accuracy": f"paired TOST, H0 |acc_arm - acc_ar| >= {accuracy_margin}; small p = equivalent",
        "mde_accuracy": "McNemar minimum detectable accuracy difference, alpha 0.05, power 0.8, "
                        "normal approximation (Connor 1987) at the observed discordance",
        "tost_logprob": f"T > 0 only: paired TOST on the target's mean per-token log-probability of the "
                        f"generated text, margin {logprob_margin} nats/token",
        **VERIFY_CONVENTIONS,
    }
