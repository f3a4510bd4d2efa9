"""Cost model (`dflash2.evaluation.analysis.cost`): exact fits, acceptance algebra against Monte Carlo,
calibration from evaluation records (in- and out-of-sample), best-N choice, bad inputs."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from dflash2.evaluation.analysis import cost
from dflash2.evaluation.analysis.cost import AcceptanceProfile, StepCost, StepCostModel
from dflash2.engine.stats import per_position_acceptance
from dflash2.evaluation.analysis.records import Record
from tests.evaluation.synthetic import record, synthetic_records

TRUE = {1: dict(overhead=2e-3, draft=3e-4, per_token=4e-5, kv=1e-7, attention=2e-9),
        4: dict(overhead=3e-3, draft=5e-4, per_token=1.5e-4, kv=4e-7, attention=8e-9)}


def true_cost(b: int, n: int, ctx: float) -> float:
    c = TRUE[b]
    return (c["overhead"] + c["draft"] * (n > 0) + c["per_token"] * (n + 1) + c["kv"] * ctx
            + c["attention"] * ctx * (n + 1))


def grid(ctxs=(512, 1024, 2048)) -> list[StepCost]:
    return [StepCost(b, n, ctx, true_cost(b, n, ctx), weight=1 + n)
            for b, n, ctx in itertools.product(TRUE, (0, 1, 3, 7, 15), ctxs)]


def test_exact_recovery_of_a_linear_cost():
    model = StepCostModel.fit(grid())
    for b, coefs in TRUE.items():
        f = model.fits[b]
        assert f.dropped == {} and f.dof == 15 - 5
        for term, v in coefs.items():
            assert f.coef[term] == pytest.approx(v, rel=1e-8), term
        assert f.max_rel_residual < 1e-10
    # Off-grid N and ctx: exact; batch 2 is the linear interpolation between batches 1 and 4.
    assert model.predict(1, 10, 3000) == pytest.approx(true_cost(1, 10, 3000), rel=1e-9)
    want = (2 / 3) * true_cost(1, 5, 700) + (1 / 3) * true_cost(4, 5, 700)
    assert model.predict(2, 5, 700) == pytest.approx(want, rel=1e-9)
    json.dumps(model.info())  # JSON-ready


def test_context_terms_dropped_at_one_context_and_extrapolation_flagged():
    model = StepCostModel.fit([m for m in grid(ctxs=(512,)) if m.batch == 1])
    f = model.fits[1]
    assert set(f.dropped) == {"kv", "attention"} and "512..512" in f.dropped["kv"]
    assert f.coef["kv"] == 0.0 and f.coef["attention"] == 0.0
    # The remaining three terms absorb the context terms at ctx = 512: exact there.
    for n in (0, 2, 10):
        assert model.predict(1, n, 512) == pytest.approx(true_cost(1, n, 512), rel=1e-9)
    assert model.extrapolation(1, 5, 512) == []
    warn = model.extrapolation(1, 20, 2048)
    assert any("N=20" in w for w in warn) and any("NOT fitted" in w for w in warn)
    # Two N values and AR: 'per_token' is not identifiable beside 'overhead' and 'draft'.
    two = StepCostModel.fit([StepCost(1, n, 512, true_cost(1, n, 512)) for n in (0, 3)])
    assert "per_token" in two.fits[1].dropped and two.fits[1].dof == 0


def test_expected_tokens_matches_monte_carlo():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.3, 0.95, size=10)
    steps = 200_000
    for n in (0, 1, 4, 10):
        # slot i is tried only when slots < i were all accepted: accepted = leading run of successes
        hits = rng.random((steps, n)) < a[:n]
        acc = np.cumprod(hits, axis=1).sum(axis=1) if n else np.zeros(steps)
        sim = acc + 1
        formula = cost.expected_tokens_per_step(a, n)
        assert abs(sim.mean() - formula) < 4 * sim.std() / np.sqrt(steps) + 1e-12, n
        # The unconditional profile the stats module reports converts back to the same law.
        u = per_position_acceptance([acc.astype(int).tolist()], n)
        prof = AcceptanceProfile.from_unconditional(u)
        assert prof.expected_tokens(n) == pytest.approx(sim.mean(), rel=1e-9)
        reached = steps * np.concatenate([[1.0], np.asarray(u[:-1])]) if n else np.ones(0)
        se = np.sqrt(a[:n] * (1 - a[:n]) / np.maximum(reached, 1))  # binomial SE of each a_i estimate
        assert np.all(np.abs(np.asarray(prof.conditional) - a[:n]) < 5 * se + 1e-9)
    assert AcceptanceProfile.from_unconditional([0.8, 0.4, 0.0, 0.0]).conditional == (0.8, 0.5, 0.0, 0.0)
    # Pooled over runs at several N: one run equals from_accepted; pooling by hand on a toy case.
    rows = [[0, 2, 3, 1], [3, 3]]
    assert AcceptanceProfile.pooled({3: rows}).conditional == pytest.approx(
        AcceptanceProfile.from_accepted(rows, 3).conditional)
    pooled = AcceptanceProfile.pooled({1: [[1, 0, 1, 1]], 2: [[2, 0]]}).conditional
    assert pooled == pytest.approx((4 / 6, 1 / 1))  # a_1 over 6 steps, a_2 over N=2's one step with >= 1


def test_best_n_picks_the_argmax():
    model = StepCostModel.fit([m for m in grid() if m.batch == 1])
    rng = np.random.default_rng(1)
    for _ in range(5):
        prof = AcceptanceProfile(tuple(rng.uniform(0.4, 0.98, size=15)))
        best, preds = cost.best_num_speculative_tokens(model, prof, batch=1, ctx=1024)
        tps = [p.tokens_per_s for p in preds]
        assert [p.n for p in preds] == list(range(1, 16)) and best == 1 + int(np.argmax(tps))
        for p in preds:
            e = cost.expected_tokens_per_step(prof.conditional, p.n)
            assert p.tokens_per_s == pytest.approx(e / true_cost(1, p.n, 1024), rel=1e-9)
            assert p.speedup == pytest.approx(e * true_cost(1, 0, 1024) / true_cost(1, p.n, 1024), rel=1e-9)
    # Free extra slots and sure acceptance -> the largest N; costly slots and poor acceptance -> N = 1.
    flat = StepCostModel.fit([StepCost(1, n, 100, 1e-3 + 1e-4 * (n > 0)) for n in (0, 1, 5)])
    assert cost.best_num_speculative_tokens(flat, [1.0] * 8, 1, 100)[0] == 8
    steep = StepCostModel.fit([StepCost(1, n, 100, 1e-3 * (n + 1)) for n in (0, 1, 5)])
    assert cost.best_num_speculative_tokens(steep, [0.5] * 8, 1, 100)[0] == 1


def test_from_records_recovers_the_synthetic_run():
    # synthetic.py: step = (1 ms + 0.05 ms * N) * U(0.95, 1.05), plus 2 ms per generation;
    # slots accepted i.i.d. with alpha = 0.7 until the first miss.
    recs = synthetic_records(n_per_dataset=16, ns=(1, 3, 7, 15), alpha=0.7)
    res = cost.from_records(recs)
    assert res["in_sample"] and res["label"].startswith("in-sample")
    stage = res["step_cost"]["T=0"]
    assert stage["batch"] == 1 and stage["per_arm_stage"]["overhead_s"] == pytest.approx(2e-3, rel=0.3)
    for arm, v in res["arms"].items():
        assert v["in_sample"]
        assert v["measured_step_s"] == pytest.approx(1e-3 + 5e-5 * v["N"], rel=0.03), arm
        assert v["predicted_step_s"] == pytest.approx(1e-3 + 5e-5 * v["N"], rel=0.03), arm
        if v["N"]:
            assert v["predicted_tau"] == pytest.approx(sum(0.7**i for i in range(v["N"] + 1)), rel=0.05)
            assert v["predicted_speedup"] == pytest.approx(v["measured_speedup"], rel=0.08), arm
            assert res["predictions"][arm] == v["predicted_speedup"]
    assert np.allclose(res["profiles"]["dflash2|T=0"]["conditional"][:4], 0.7, atol=0.07)
    assert res["profiles"]["dflash2|T=0"]["source"] == "dflash2@N=15"
    # True optimum of E(N) / (1 + 0.05 N) at alpha 0.7 is N = 5 or 6 (nearly flat there).
    assert res["best_n"]["dflash2|T=0"]["N"] in (4, 5, 6, 7)
    json.dumps(res)


def test_from_records_out_of_sample():
    recs = synthetic_records(n_per_dataset=16, ns=(1, 3, 7, 15), alpha=0.7)
    res = cost.from_records(recs, calibrate_arms=["ar", "dflash2@N=1", "dflash2@N=3", "dflash2@N=15"],
                            predict_arms=["dflash2@N=7"])
    assert not res["in_sample"] and res["label"].startswith("out-of-sample")
    assert list(res["predictions"]) == ["dflash2@N=7"]
    v = res["arms"]["dflash2@N=7"]
    assert not v["in_sample"] and v["measured_step_s"] is None
    assert v["predicted_step_s"] == pytest.approx(1e-3 + 5e-5 * 7, rel=0.03)
    assert v["predicted_speedup"] == pytest.approx(v["measured_speedup"], rel=0.08)
    with pytest.raises(ValueError, match="AR arm"):
        cost.from_records(recs, calibrate_arms=["dflash2@N=1", "dflash2@N=3"])


def test_for_report_gate_and_errors():
    one_n = synthetic_records(n_per_dataset=4, ns=(3,))
    info, preds = cost.for_report(one_n)
    assert preds is None and "skipped" in info
    two = synthetic_records(n_per_dataset=4, ns=(3, 7))
    info, preds = cost.for_report(two)
    assert set(preds) == {"dflash2@N=3", "dflash2@N=7"} and info["note"].startswith("cost model (in-sample)")
    # Each arm kind gets its own step-cost fit; a kind with one N value is skipped, with the reason.
    mixed = synthetic_records(n_per_dataset=4, ns=(3, 7), selector_off=True)
    info, preds = cost.for_report(mixed)
    assert set(preds) == {"dflash2@N=3", "dflash2@N=7"} and "selector_off|T=0" in info["skipped"]
    assert set(info["step_cost"]) == {"T=0", "dflash2|T=0"}
    # Several temperatures: arm keys as in stats.summarize.
    multi = two + synthetic_records(n_per_dataset=4, ns=(3, 7), temperature=0.7, seed=1)
    info, preds = cost.for_report(multi)
    assert set(preds) == {f"dflash2@N={n}|T={t}" for n in (3, 7) for t in ("0", "0.7")}
    broken = [dict(r, wall_s=0.0) for r in two]
    info, preds = cost.for_report(broken)
    assert preds is None and "ValueError" in info["error"]


def test_bad_inputs_fail_clearly():
    model = StepCostModel.fit([m for m in grid() if m.batch in (1, 4)])
    with pytest.raises(ValueError, match="batch=8 is outside"):
        model.predict(8, 3, 512)
    with pytest.raises(ValueError, match="exceeds the acceptance profile"):
        cost.expected_tokens_per_step([0.5, 0.5], 3)
    with pytest.raises(ValueError, match="must not increase"):
        AcceptanceProfile.from_unconditional([0.5, 0.7])
    with pytest.raises(ValueError, match="seconds"):
        StepCostModel.fit([StepCost(1, 0, 10, 0.0)])
    ext = AcceptanceProfile((0.8, 0.6)).extended(4)
    assert ext.conditional == (0.8, 0.6, 0.6, 0.6) and ext.extended_from == 2
    p = cost.predict_speedup(model, ext, 1, 4, 512)
    assert any("beyond position 2" in w for w in p.warnings)


def test_eval_report_rebuild_writes_cost_model(tmp_path):
    import importlib.util
    from pathlib import Path

    recs = synthetic_records(n_per_dataset=3, ns=(3, 7))
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    spec = importlib.util.spec_from_file_location("eval_report", Path(__file__).parents[2] / "eval" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main([str(tmp_path), "--n-resamples", "50"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    cm = summary["cost_model"]
    assert cm["in_sample"] and set(cm["predictions"]) == {"dflash2@N=3", "dflash2@N=7"}
    assert any(n.startswith("cost model (in-sample)") for n in summary["notes"])
    assert (tmp_path / "plots" / "predicted_vs_measured_speedup.png").is_file()
    assert "cost model (in-sample)" in (tmp_path / "report.md").read_text()


def _batched_records(batch: int = 4, n_batches: int = 6, ns=(1, 3, 7, 15), seed: int = 0) -> list[dict]:
    """Batches whose rows differ in acceptance (half the rows accept each slot w.p. 0.9, half w.p.
    0.2): a batch steps until its slowest row is done, and the runner splits the batch's wall time
    (2 ms + c(N) per step) evenly over its rows, as `EvalRunner` does."""
    rng = np.random.default_rng(seed)
    recs = []
    for g in range(n_batches):
        rows = [(f"gsm8k/{g * batch + i:04d}", 0.9 if i % 2 == 0 else 0.2, int(rng.integers(60, 120)))
                for i in range(batch)]
        for arm, kind, n in [("ar", "ar", 0)] + [(f"dflash2@N={n}", "spec", n) for n in ns]:
            accepted = {}
            for sid, alpha, length in rows:
                acc, made = [], 1
                while made < length:
                    a = 0
                    while n and a < n and rng.random() < alpha:
                        a += 1
                    acc.append(a)
                    made += a + 1
                accepted[sid] = acc
            steps = max(len(a) for a in accepted.values())
            wall = (2e-3 + steps * (1e-3 + 5e-5 * n)) / batch
            for sid, _, length in rows:
                recs.append({"arm": arm, "arm_kind": kind, "num_speculative_tokens": n, "temperature": 0.0,
                             "dataset": "gsm8k", "finish_reason": "length", "sample_id": sid, "prompt_tokens": 30,
                             "tokens": list(range(length)),
                             "wall_s": wall, "steps": len(accepted[sid]), "accepted": accepted[sid],
                             "batch_size": batch})
    return recs


def test_end_to_end_prediction_counts_batch_stragglers():
    """A batch lasts as long as its slowest row: with per-row acceptance profiles the predicted
    end-to-end speedup matches the measured one; the pooled profile for every row (the old
    formula) would over-predict it badly, so the check is not trivial."""
    recs = _batched_records()
    res = cost.from_records(recs, calibrate_arms=["ar", "dflash2@N=1", "dflash2@N=3", "dflash2@N=15"])
    assert res["step_cost"]["T=0"]["batch"] == 4
    prof = AcceptanceProfile(tuple(res["profiles"]["dflash2|T=0"]["conditional"]))
    for arm in ("dflash2@N=3", "dflash2@N=7", "dflash2@N=15"):
        v = res["arms"][arm]
        assert v["predicted_speedup"] == pytest.approx(v["measured_speedup"], rel=0.08), arm
        # what one pooled E per row predicts: a batch of B rows needs max(tokens - 1) / E steps
        e = prof.extended(v["N"]).expected_tokens(v["N"])
        gens = [recs[i:i + 4] for i in range(0, len(recs), 4) if recs[i]["arm"] == "ar"]
        ar_s = sum(2e-3 + v_ar * max(len(r["tokens"]) - 1 for r in g)
                   for g in gens for v_ar in [res["arms"]["ar"]["predicted_step_s"]])
        sp_s = sum(2e-3 + v["predicted_step_s"] * (max(len(r["tokens"]) - 1 for r in g) + (e - 1) / 2) / e
                   for g in gens)
        pooled, measured = ar_s / sp_s, v["measured_speedup"]
        assert pooled > 1.1 * measured, arm
        assert abs(v["predicted_speedup"] - measured) < 0.5 * abs(pooled - measured), arm
    best = res["best_n"]["dflash2|T=0"]
    assert best["N_end_to_end"] in range(1, 16) and set(best["predicted_end_to_end_speedup"]) >= {"1", "15"}
    measured = {res["arms"][a]["N"]: res["arms"][a]["measured_speedup"] for a in res["arms"] if res["arms"][a]["N"]}
    assert best["predicted_end_to_end_speedup"][str(max(measured, key=measured.get))] >= \
        0.9 * max(best["predicted_end_to_end_speedup"].values())


def test_step_costs_never_trade_the_overhead_for_a_negative_step_cost():
    """Generations of nearly equal length (batches that always reach the token cap) let lstsq
    explain the wall by the overhead alone and give one arm a negative step cost; the fit then
    folds the overhead into positive step costs. Real numbers from an H200 run's shape: AR and
    N = 1 generations of 255 steps with a little noise."""
    def rec(arm, steps, wall):
        return Record.from_json(record(arm, "s", steps=steps, accepted=[0] * steps, wall_s=wall))

    gens = {"ar": [[rec("ar", 255, 2.00)], [rec("ar", 254, 2.02)], [rec("ar", 255, 1.99)]],
            "n1": [[rec("n1", 200, 2.10)], [rec("n1", 201, 2.05)], [rec("n1", 199, 2.12)]]}
    x = np.array([[1, 255, 0], [1, 254, 0], [1, 255, 0], [1, 0, 200], [1, 0, 201], [1, 0, 199]], float)
    beta = np.linalg.lstsq(x, np.array([2.00, 2.02, 1.99, 2.10, 2.05, 2.12]), rcond=None)[0]
    assert beta[0] > 0 and min(beta[1:]) < 0  # the trap this guards against is real for these data
    step, overhead, info = cost._step_costs(gens)
    assert overhead == 0.0 and all(c > 0 for c in step.values()) and "refitted without it" in info["note"]
    assert step["ar"] == pytest.approx(np.mean([2.00 / 255, 2.02 / 254, 1.99 / 255]), rel=0.01)
