"""Statistics against published or independently computed values, and `summarize` on synthetic records."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from dflash2.engine.stats import accepted_length_histogram, per_position_acceptance, tau_per_request_mean, tau_pooled
from dflash2.evaluation.analysis.stats import (
    bootstrap_ci,
    mcnemar_exact,
    mcnemar_mde,
    paired_bootstrap_ci,
    summarize,
    tost_paired,
)
from tests.evaluation.synthetic import expected_tau, synthetic_records

# ------------------------------------------------------------------------------ McNemar


def test_mcnemar_exact_hand_computed():
    # b=1, c=9: 2 * P(Bin(10, 1/2) <= 1) = 2 * (1 + 10) / 1024 = 0.021484375
    assert mcnemar_exact(1, 9) == pytest.approx(0.021484375, abs=1e-15)
    assert mcnemar_exact(9, 1) == pytest.approx(0.021484375, abs=1e-15)
    # b=0, c=5: 2 / 32 = 0.0625 (five one-sided discordant pairs can never reach 0.05)
    assert mcnemar_exact(0, 5) == pytest.approx(0.0625, abs=1e-15)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(4, 4) == 1.0  # 2 * P(X <= 4 | n=8) > 1 -> capped


@pytest.mark.parametrize("b,c", [(0, 1), (2, 7), (13, 30), (50, 61), (120, 80)])
def test_mcnemar_exact_matches_binomial_test(b, c):
    want = sps.binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue
    assert mcnemar_exact(b, c) == pytest.approx(min(1.0, want), rel=1e-12)
    assert mcnemar_exact(b, c) == pytest.approx(min(1.0, 2 * sps.binom.cdf(min(b, c), b + c, 0.5)), rel=1e-12)


def test_mcnemar_exact_rejects_negative():
    with pytest.raises(ValueError, match="b=-1"):
        mcnemar_exact(-1, 3)


# ------------------------------------------------------------------------------ TOST


def _tost_by_hand(x, y, margin):
    d = np.asarray(x) - np.asarray(y)
    p_low = sps.ttest_1samp(d, -margin, alternative="greater").pvalue
    p_up = sps.ttest_1samp(d, margin, alternative="less").pvalue
    return max(p_low, p_up)


def test_tost_equal_within_margin_is_equivalent():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, 500)
    y = x + rng.normal(0, 0.05, 500)  # true difference 0, se ~ 0.0022 << margin
    p = tost_paired(x, y, 0.02)
    assert p < 1e-6
    assert p == pytest.approx(_tost_by_hand(x, y, 0.02), rel=1e-9)


def test_tost_shifted_by_twice_the_margin_is_not_equivalent():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, 500)
    y = x - 0.04 + rng.normal(0, 0.05, 500)  # mean(x - y) = 2 * margin
    p = tost_paired(x, y, 0.02)
    assert p > 0.99
    assert p == pytest.approx(_tost_by_hand(x, y, 0.02), rel=1e-9)


def test_tost_degenerate_and_bad_input():
    same = np.array([1.0, 0.0, 1.0, 1.0])
    assert tost_paired(same, same, 0.02) == 0.0  # identical paired outcomes: difference exactly 0
    assert tost_paired(same + 0.5, same, 0.02) == 1.0
    assert math.isnan(tost_paired([1.0], [1.0], 0.02))
    with pytest.raises(ValueError, match="margin"):
        tost_paired(same, same, 0.0)
    with pytest.raises(ValueError, match="paired"):
        tost_paired(same, same[:3], 0.1)


# ------------------------------------------------------------------------------ bootstrap


def test_paired_bootstrap_deterministic_and_known_cases():
    rng = np.random.default_rng(3)
    x, y = rng.uniform(1, 2, 40), rng.uniform(1, 2, 40)

    def ratio(a, b):
        return a.sum() / b.sum()

    ci1 = paired_bootstrap_ci(x, y, ratio, 500, seed=7)
    assert ci1 == paired_bootstrap_ci(x, y, ratio, 500, seed=7)
    assert ci1 != paired_bootstrap_ci(x, y, ratio, 500, seed=8)
    assert ci1[0] < x.sum() / y.sum() < ci1[1]
    # The vectorized form draws the same resamples.
    vec = paired_bootstrap_ci(x, y, lambda a, b, axis=-1: a.sum(axis) / b.sum(axis), 500, seed=7, vectorized=True)
    assert vec == pytest.approx(ci1, rel=1e-12)
    # y = 2x exactly: every resample has ratio 1/2, so the interval collapses.
    assert paired_bootstrap_ci(x, 2 * x, ratio, 200, seed=0) == pytest.approx((0.5, 0.5))
    assert all(math.isnan(v) for v in paired_bootstrap_ci([1.0], [2.0], ratio, 100, 0))


def test_paired_bootstrap_coverage_of_a_mean_difference():
    # 200 paired data sets with a known mean difference of 0.3: a 95% interval should cover
    # it about 95% of the time (percentile bootstrap at n=60 runs slightly narrow).
    rng = np.random.default_rng(4)
    covered = 0
    for t in range(200):
        x = rng.normal(0.3, 1, 60)
        y = 0.5 * x + rng.normal(0, 1, 60) - 0.15  # E[x - y] = 0.5 * 0.3 + 0.15 = 0.3
        lo, hi = paired_bootstrap_ci(x, y, lambda a, b, axis=-1: (a - b).mean(axis), 400, seed=t, vectorized=True)
        covered += lo <= 0.3 <= hi
    assert 0.88 <= covered / 200 <= 0.99


def test_bootstrap_ci_width_matches_normal_theory():
    x = np.random.default_rng(5).normal(0, 2, 400)
    lo, hi = bootstrap_ci(x, np.mean, 2000, seed=0)
    normal = 2 * 1.959964 * x.std(ddof=1) / math.sqrt(x.size)
    assert hi - lo == pytest.approx(normal, rel=0.12)


# ------------------------------------------------------------------------------ MDE


def _required_n(delta, psi, alpha=0.05, power=0.8):
    # Connor (1987) sample size for McNemar, written out independently of mcnemar_mde.
    za, zb = sps.norm.ppf(1 - alpha / 2), sps.norm.ppf(power)
    return (za * math.sqrt(psi) + zb * math.sqrt(psi - delta ** 2)) ** 2 / delta ** 2


@pytest.mark.parametrize("n,psi", [(200, 0.2), (1319, 0.05), (500, 0.1)])
def test_mcnemar_mde_inverts_connor_sample_size(n, psi):
    d = mcnemar_mde(n, psi)
    assert 0 < d <= psi
    assert _required_n(d, psi) == pytest.approx(n, rel=1e-6)


def test_mcnemar_mde_has_the_stated_power():
    # Simulated power of the exact test at the MDE (independent of the formula): about 0.8;
    # the exact test is conservative, so a bit below.
    n, psi = 300, 0.2
    d = mcnemar_mde(n, psi)
    rng = np.random.default_rng(6)
    cells = rng.multinomial(n, [(psi + d) / 2, (psi - d) / 2, 1 - psi], size=4000)
    b, c = cells[:, 0], cells[:, 1]
    p = np.minimum(1.0, 2 * sps.binom.cdf(np.minimum(b, c), b + c, 0.5))
    assert 0.7 <= (p < 0.05).mean() <= 0.88


def test_mcnemar_mde_edge_cases():
    assert math.isnan(mcnemar_mde(100, 0.0))
    assert math.isinf(mcnemar_mde(20, 0.05))  # one discordant pair in 20: nothing detectable
    assert mcnemar_mde(1000, 0.1) < mcnemar_mde(100, 0.1)
    with pytest.raises(ValueError, match="discordance"):
        mcnemar_mde(10, 1.5)


# ------------------------------------------------------------------------------ summarize


@pytest.fixture(scope="module")
def flipped():
    recs = synthetic_records(n_per_dataset=12, ns=(3, 7), flip={"dflash2@N=7": [0, 3, 6]}, selector_off=True)
    return recs, summarize(recs, n_resamples=500)


def test_summary_tau_and_acceptance_match_the_engine_conventions(flipped):
    recs, s = flipped
    assert s["arms"] == ["ar", "dflash2@N=3", "dflash2@N=7", "selector_off@N=7"]
    assert s["n_samples"] == 36 and s["datasets"] == ["gsm8k", "humaneval", "mt_bench"]
    json.dumps(s, allow_nan=False)  # strict JSON
    for arm, n in [("dflash2@N=3", 3), ("dflash2@N=7", 7)]:
        acc = [r["accepted"] for r in recs if r["arm"] == arm]
        o = s["per_arm"][arm]["overall"]
        assert o["tau_pooled"] == pytest.approx(tau_pooled(acc))
        assert o["tau_per_request"] == pytest.approx(tau_per_request_mean(acc))
        assert o["per_position_acceptance"] == pytest.approx(per_position_acceptance(acc, n))
        assert o["accepted_length_histogram"] == accepted_length_histogram(acc, n)
        assert o["tau_pooled_ci"][0] < o["tau_pooled"] < o["tau_pooled_ci"][1]
        # Generated with per-slot acceptance 0.7: the truncated-geometric mean lies inside the CI.
        assert o["tau_pooled_ci"][0] < expected_tau(0.7, n) < o["tau_pooled_ci"][1]
        assert len(o["per_position_acceptance_ci"]) == n
    ar = s["per_arm"]["ar"]["overall"]
    assert ar["tau_pooled"] == 1.0 and ar["per_position_acceptance"] == [] and ar["speedup"] == 1.0


def test_summary_speedup_is_paired_ratio_of_wall_times(flipped):
    recs, s = flipped
    wall = {(r["arm"], r["sample_id"]): r["wall_s"] for r in recs}
    ids = {r["sample_id"] for r in recs}
    for arm in ("dflash2@N=3", "dflash2@N=7", "selector_off@N=7"):
        o = s["per_arm"][arm]["overall"]
        want = sum(wall["ar", i] for i in ids) / sum(wall[arm, i] for i in ids)
        assert o["speedup"] == pytest.approx(want)
        assert o["speedup_ci"][0] < want < o["speedup_ci"][1]
        gsm = s["per_arm"][arm]["by_dataset"]["gsm8k"]
        g_ids = [i for i in ids if i.startswith("gsm8k/")]
        assert gsm["speedup"] == pytest.approx(sum(wall["ar", i] for i in g_ids) / sum(wall[arm, i] for i in g_ids))
    vs = s["vs_n"]["dflash2"]
    assert vs["N"] == [3, 7] and vs["arms"] == ["dflash2@N=3", "dflash2@N=7"]
    assert vs["speedup"][1] == s["per_arm"]["dflash2@N=7"]["overall"]["speedup"]
    assert s["vs_n"]["selector_off"]["N"] == [7]


def test_speedup_ci_resamples_batches_not_rows(flipped):
    """Rows of one generation batch share its wall time: the CI must come from whole batches."""
    recs = [dict(r) for r in flipped[0]]
    ids = sorted({r["sample_id"] for r in recs})
    per_batch = {sid: i // 6 for i, sid in enumerate(ids)}  # 36 samples in 6 batches of 6
    for r in recs:
        r["batch"] = f"0/{per_batch[r['sample_id']]}"
    o = summarize(recs, n_resamples=500)["per_arm"]["dflash2@N=7"]["overall"]
    assert o["speedup_batches"] == 6
    arm_rows = [r for r in recs if r["arm"] == "dflash2@N=7"]
    order = list(dict.fromkeys(per_batch[r["sample_id"]] for r in arm_rows))  # batches in order of appearance
    wall = {(r["arm"], r["sample_id"]): r["wall_s"] for r in recs}
    sums = {a: np.array([sum(wall[a, r["sample_id"]] for r in arm_rows if per_batch[r["sample_id"]] == b)
                         for b in order]) for a in ("ar", "dflash2@N=7")}
    want = paired_bootstrap_ci(sums["ar"], sums["dflash2@N=7"], lambda a, b, axis=-1: a.sum(axis) / b.sum(axis),
                               500, 0, vectorized=True)
    assert o["speedup_ci"] == pytest.approx(list(want))
    # One batch (e.g. a sweep whose prompts fit one batch): no interval, rather than a zero-width one.
    one = [dict(r, batch="0/0", wall_s=2.0 if r["arm"] == "ar" else 1.0) for r in recs]
    o1 = summarize(one, n_resamples=200)["per_arm"]["dflash2@N=7"]["overall"]
    assert o1["speedup"] == pytest.approx(2.0) and o1["speedup_batches"] == 1 and o1["speedup_ci"] == [None, None]
    # Records written before the batch field: members of a batch share (wall_s, batch_size) exactly.
    old = [dict({k: v for k, v in r.items() if k != "batch"}, wall_s=per_batch[r["sample_id"]] + 1.0, batch_size=6)
           for r in recs]
    assert summarize(old, n_resamples=200)["per_arm"]["dflash2@N=7"]["overall"]["speedup_batches"] == 6


def test_summary_paired_correctness_tests(flipped):
    recs, s = flipped
    o = s["per_arm"]["dflash2@N=7"]["overall"]
    # Flipped samples 0, 3, 6 are gsm8k/0000, gsm8k/0001, gsm8k/0002 (3 datasets interleaved).
    ar_ok = {r["sample_id"]: r["correct"] for r in recs if r["arm"] == "ar"}
    flipped_ids = ["gsm8k/0000", "gsm8k/0001", "gsm8k/0002"]
    only_ar = sorted(i for i in flipped_ids if ar_ok[i])
    only_arm = sorted(i for i in flipped_ids if not ar_ok[i])
    m = o["mcnemar"]
    assert m["discordant"] == {"only_arm_correct": only_arm, "only_ar_correct": only_ar}
    assert m["p"] == pytest.approx(mcnemar_exact(len(only_arm), len(only_ar)))
    assert o["n_scored_paired"] == 24 and o["discordance"] == pytest.approx(3 / 24)
    assert o["tost_accuracy_p"] > 0.05  # 3 flips in 24 cannot show +-2-point equivalence
    assert o["identical_fraction"] == pytest.approx(33 / 36) and o["n_departures"] == 3
    assert {d["sample_id"] for d in o["departures"]} == set(flipped_ids)
    same = s["per_arm"]["dflash2@N=3"]["overall"]
    assert same["mcnemar"]["p"] == 1.0 and same["tost_accuracy_p"] == 0.0 and same["mde_accuracy"] is None
    assert same["identical_fraction"] == 1.0 and same["departures"] == []
    assert "tost_logprob_p" not in same  # greedy: no distribution-level test
    assert any("dflash2@N=7" in n and "McNemar" in n for n in s["notes"])
    cats = s["per_arm"]["dflash2@N=7"]["by_category"]
    assert sorted(cats) == ["coding", "math", "reasoning", "writing"] and cats["math"]["tau_pooled"] > 1


def test_summary_sampled_logprob_tost_and_duplicates():
    recs = synthetic_records(n_per_dataset=10, ns=(4,), temperature=0.7, seed=1)
    stale = dict(recs[-1], wall_s=1e6)  # an earlier record of the same (arm, sample), replaced on resume
    s = summarize([stale] + recs, n_resamples=300)
    o = s["per_arm"]["dflash2@N=4"]["overall"]
    assert s["temperatures"] == [0.7] and s["n_records"] == len(recs)
    assert o["tost_logprob_p"] < 0.01 and abs(o["logprob_diff"]) < 0.01
    assert "departures" not in o  # at T > 0 outputs depart by design


def test_summary_several_temperatures_pair_with_their_own_ar():
    a = synthetic_records(n_per_dataset=4, ns=(3,), temperature=0.0)
    b = synthetic_records(n_per_dataset=4, ns=(3,), temperature=1.0, seed=2)
    s = summarize(a + b, n_resamples=100)
    assert s["arms"] == ["ar|T=0", "dflash2@N=3|T=0", "ar|T=1", "dflash2@N=3|T=1"]
    wall = {(r["arm"], r["sample_id"]): r["wall_s"] for r in b}
    want = sum(v for (arm, _), v in wall.items() if arm == "ar") / sum(
        v for (arm, _), v in wall.items() if arm != "ar")
    assert s["per_arm"]["dflash2@N=3|T=1"]["overall"]["speedup"] == pytest.approx(want)
    assert set(s["vs_n"]) == {"dflash2|T=0", "dflash2|T=1"}


def test_the_sample_size_floors_are_where_the_tests_can_first_speak():
    from dflash2.evaluation.analysis.stats import mcnemar_min_discordant, tost_min_pairs

    d = mcnemar_min_discordant()
    assert d == 6 and mcnemar_exact(d, 0) <= 0.05 < mcnemar_exact(d - 1, 0)   # the most lopsided split
    assert mcnemar_min_discordant(0.01) == 8 and mcnemar_exact(8, 0) <= 0.01 < mcnemar_exact(7, 0)
    for margin, floor in [(0.02, 149), (0.05, 59), (0.1, 29)]:
        n = tost_min_pairs(margin)
        # n pairs with no discordant one bound the discordance rate below the margin at 95%, n - 1 do not
        assert n == floor and (1 - margin) ** n <= 0.05 < (1 - margin) ** (n - 1)
    with pytest.raises(ValueError, match="margin"):
        tost_min_pairs(0.0)


def test_reports_print_n_too_small_below_the_floors(flipped):
    from dflash2.evaluation.analysis.report import COLUMNS, fmt_mcnemar_p, summary_rows

    _, s = flipped
    o = s["per_arm"]["dflash2@N=7"]["overall"]
    assert o["mcnemar"]["n_min_discordant"] == 6 and o["tost_accuracy_n_min"] == 149
    row = dict(zip(COLUMNS, next(r for r in summary_rows(s) if r[0] == "dflash2@N=7")))
    assert row["McNemar p"] == "n too small (need >= 6 discordant)"      # 3 discordant pairs
    assert row["TOST acc p"] == "n too small (need >= 149)"               # 24 scored pairs
    same = dict(zip(COLUMNS, next(r for r in summary_rows(s) if r[0] == "dflash2@N=3")))
    assert same["TOST acc p"] == "n too small (need >= 149)"              # p = 0 from 24 pairs is not shown
    # At the floors the p-values are printed.
    assert fmt_mcnemar_p({"b_only_arm_correct": 6, "c_only_ar_correct": 0, "p": 0.03125, "n_min_discordant": 6}) \
        == "0.031"
    huge = synthetic_records(n_per_dataset=80, ns=(3,))
    h = summarize(huge, n_resamples=50)
    row = dict(zip(COLUMNS, next(r for r in summary_rows(h) if r[0] == "dflash2@N=3")))
    assert h["per_arm"]["dflash2@N=3"]["overall"]["n_scored_paired"] == 160 and row["TOST acc p"] == "0"


def test_summary_rejects_bad_records():
    rec = synthetic_records(n_per_dataset=1, ns=(3,))[1]
    with pytest.raises(ValueError, match="wall_s"):
        summarize([{k: v for k, v in rec.items() if k != "wall_s"}])
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        summarize([dict(rec, accepted=[5])])
    with pytest.raises(ValueError, match=r"1 accepted counts for \d+ steps"):
        summarize([dict(rec, accepted=[1])])
    with pytest.raises(ValueError, match=r"unknown fields \['tau'\]"):
        summarize([dict(rec, tau=2.0)])
