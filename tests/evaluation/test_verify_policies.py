"""The verify-policy arms (issue 43, "Evaluation"): `adaptive@N=n` and `tree<B>@N=n` built from
`ArmsSpec`, passed to the engine by the runner and reproducing the AR tokens at T = 0 with an
accepting proposer; their records' verify fields; the per-depth acceptance on hand-made records;
an end-to-end run (`experiment=verify_policies_tiny_cpu`) with its summary, table, plot, cost
model and W&B keys; and the config's one-line refusals."""

from __future__ import annotations

import json

import pytest

from dflash2.evaluation.analysis.records import Record, arm_family, verify_of
from dflash2.evaluation.analysis.verify import depth_acceptance, verify_metrics
from dflash2.evaluation.arms import (MAX_TREE_BUDGET, VERIFY_POLICIES, Arm, build_arms, forward_rows, verify_rows)
from dflash2.evaluation.running.config import ArmsSpec, validate
from tests.evaluation.synthetic import record
from tests.evaluation.test_eval_configs import _compose


def test_the_policies_and_the_budget_cap_are_the_engines():
    from dflash2.engine.inputs import MAX_TREE_BUDGET as ENGINE_MAX
    from dflash2.engine.verify import VERIFY_POLICIES as ENGINE_POLICIES

    assert VERIFY_POLICIES == ENGINE_POLICIES and MAX_TREE_BUDGET == ENGINE_MAX


def test_arms_labels_and_what_they_pass_to_the_engine():
    cfg = ArmsSpec(num_speculative_tokens=[15, 3, 7], selector_off=False, adaptive=True,
                   adaptive_num_speculative_tokens=[15], tree=True, tree_num_speculative_tokens=[15],
                   tree_budgets=[64, 16, 32, 32])
    arms = build_arms(cfg, has_draft=True, draft_has_selector=True)
    assert [a.label for a in arms] == ["ar", "dflash2@N=3", "dflash2@N=7", "dflash2@N=15", "adaptive@N=15",
                                       "tree16@N=15", "tree32@N=15", "tree64@N=15"]
    by = {a.label: a for a in arms}
    assert by["dflash2@N=7"].verify_kwargs == {} and by["ar"].verify_kwargs == {}  # the engine's default call
    assert by["adaptive@N=15"].verify_kwargs == {"verify": "adaptive"}
    assert by["tree32@N=15"].verify_kwargs == {"verify": "tree", "tree_budget": 32}
    assert [arm_family(a.label) for a in arms[-3:]] == ["tree16", "tree32", "tree64"]
    # rows: chain L + 1, adaptive L + 1 (ragged) but its forward N + 1, tree its budget, AR 1
    assert by["adaptive@N=15"].verify_rows([15, 3, 1]) == [16, 4, 2] and forward_rows("adaptive", 15) == 16
    assert by["tree16@N=15"].verify_rows([15, 15]) == [16, 16] and forward_rows("tree", 15, 64) == 64
    assert verify_rows("chain", [0, 0]) == [1, 1] and forward_rows("tree", 0, 32) == 1
    # exact mode: "rows" pads every chain forward (AR too); a tree adds its confirming chain forward
    assert forward_rows("chain", 0, exact_impl="rows", exact_block_size=16) == 16
    assert forward_rows("adaptive", 7, exact_impl="invariant", exact_block_size=16) == 8
    assert forward_rows("tree", 7, 32, exact_impl="invariant", exact_block_size=16) == 32 + 8
    assert forward_rows("tree", 7, 32, exact_impl="rows", exact_block_size=16) == 32 + 16
    v1 = [a.label for a in build_arms(cfg, has_draft=True, draft_has_selector=False)]
    assert v1 == [a.label for a in arms]  # no selector needed: a v1 tree is the chain plus padding
    assert [a.label for a in build_arms(cfg, has_draft=False, draft_has_selector=False)] == ["ar"]


# ------------------------------------------------------------------ through the runner

N, BUDGETS, MAX_NEW = 3, (4, 12), 24


def _oracle_run(*overrides: str) -> dict[str, list[Record]]:
    """Every arm of `verify_policies_tiny_cpu` (+ `overrides`) through `EvalRunner._run_arm` on two
    GSM8K prompts in one batch, each arm's draft (what `draft_for_arm` hands the engine) an oracle
    over the AR arm's tokens (slots right with probability 0.6), so that steps accept tokens and
    reject others. Returns arm label -> its two records."""
    from dflash2.evaluation.arms.oracle_proposers import OracleProposer
    from dflash2.evaluation.running import datasets as ds
    from dflash2.evaluation.running import runner as runner_module
    from dflash2.evaluation.running.runner import EvalRunner, sample_seed

    cfg = _compose(["experiment=verify_policies_tiny_cpu", f"max_new_tokens={MAX_NEW}", "output_dir=/tmp/unused",
                    *overrides])
    runner = EvalRunner(cfg, "/tmp/unused")
    items = [(it, 1) for it in ds.load_items("gsm8k", source="local", limit=2)]
    ar = runner._run_arm(runner.arms[0], items, {})
    ar_by_id = {r.sample_id: r for r in ar}
    refs = [runner._prompt(it, t, ar_by_id) + r.tokens for (it, t), r in zip(items, ar)]
    oracle = OracleProposer(refs, [sample_seed(cfg.seed, r.sample_id) for r in ar], block_size=16, accept_prob=0.6,
                            vocab_size=runner.target.vocab_size)
    out = {"ar": ar}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner_module, "draft_for_arm", lambda arm, **kw: oracle)
        for arm in runner.arms[1:]:
            out[arm.label] = runner._run_arm(arm, items, ar_by_id)
    return out


@pytest.fixture(scope="module")
def policy_records():
    """`_oracle_run` with chain N = 2, 3, adaptive N = 3, trees of 4 and 12 nodes, T = 0."""
    return _oracle_run(f"arms.tree_budgets=[{BUDGETS[0]},{BUDGETS[1]}]")


def test_every_policy_arm_reproduces_the_ar_tokens(policy_records):
    assert set(policy_records) == {"ar", "dflash2@N=2", "dflash2@N=3", "adaptive@N=3", "tree4@N=3", "tree12@N=3"}
    ar = [r.tokens for r in policy_records["ar"]]
    for label, recs in policy_records.items():
        assert [r.tokens for r in recs] == ar, label
        assert all(r.identical_to_ar for r in recs) or label == "ar"
    assert sum(sum(r.accepted) for r in policy_records["dflash2@N=3"]) >= 6  # the identity is not trivial


def test_records_carry_the_policy_lengths_and_rows(policy_records):
    for r in policy_records["ar"]:
        assert (r.verify_policy, r.tree_budget, set(r.verify_lengths), set(r.verify_rows)) == ("chain", None, {0}, {1})
    for r in policy_records["dflash2@N=3"]:
        assert (r.verify_policy, r.tree_budget, set(r.verify_lengths), set(r.verify_rows)) == ("chain", None, {3}, {4})
    lengths = []
    for r in policy_records["adaptive@N=3"]:
        assert r.verify_policy == "adaptive" and r.tree_budget is None
        want = [N]  # the engine's schedule from the row's own accepted counts: +2 after all L accepted, else -1
        for a in r.accepted[:-1]:
            want.append(min(N, want[-1] + 2) if a == want[-1] else max(1, want[-1] - 1))
        assert r.verify_lengths == want and r.verify_rows == [n + 1 for n in want]
        lengths += want
    assert min(lengths) < N and max(lengths) == N  # both shrinks and regrowth happened
    chain = policy_records["dflash2@N=3"]
    for budget in BUDGETS:
        for r, c in zip(policy_records[f"tree{budget}@N=3"], chain):
            assert (r.verify_policy, r.tree_budget, set(r.verify_lengths)) == ("tree", budget, {N})
            assert r.verify_rows == [budget] * r.steps
            if budget == N + 1:  # a tree of N + 1 nodes is the chain: the same steps
                assert r.accepted == c.accepted
    tree, base = (sum(sum(r.accepted) for r in policy_records[k]) for k in ("tree12@N=3", "dflash2@N=3"))
    assert tree > base  # the right siblings of rejected drafts are in the larger tree


def test_exact_mode_counts_the_padding_and_the_trees_confirming_forward():
    """exact=true on the CPU (exact_impl rows: every forward padded to the drafter's block, 16):
    every arm still equals AR, and the forward rows per step are what the engine runs: 16 for the
    chain, adaptive and AR alike, a tree's 12 nodes plus the confirming chain forward's 16."""
    run = _oracle_run("exact=true", "arms.num_speculative_tokens=[3]", "arms.tree_budgets=[12]")
    assert set(run) == {"ar", "dflash2@N=3", "adaptive@N=3", "tree12@N=3"}
    ar = [r.tokens for r in run["ar"]]
    fwd = {}
    for label, recs in run.items():
        assert [r.tokens for r in recs] == ar and {r.exact_impl for r in recs} == {"rows"}, label
        fwd[label] = {verify_of(r)["forward_rows"] for r in recs}
    assert fwd == {"ar": {16}, "dflash2@N=3": {16}, "adaptive@N=3": {16}, "tree12@N=3": {12 + 16}}
    assert sum(sum(r.accepted) for r in run["tree12@N=3"]) > sum(sum(r.accepted) for r in run["dflash2@N=3"])
    assert verify_metrics(run["tree12@N=3"], N)["forward_rows_per_step"] == 28.0


def test_sampled_policy_arms_record_their_lengths():
    """T = 1: the arms run (the engine samples the tree and the adaptive lengths' steps), and the
    records keep the contracts: lengths N for the tree, the adaptive schedule, rows per policy."""
    run = _oracle_run("temperature=1.0", "arms.num_speculative_tokens=[3]", "arms.tree_budgets=[8]")
    for r in run["tree8@N=3"]:
        assert set(r.verify_lengths) == {N} and r.verify_rows == [8] * r.steps and len(r.tokens) == MAX_NEW
    for r in run["adaptive@N=3"]:
        want = [N]
        for a in r.accepted[:-1]:
            want.append(min(N, want[-1] + 2) if a == want[-1] else max(1, want[-1] - 1))
        assert r.verify_lengths == want


# ------------------------------------------------------------------ records and per-depth acceptance


def _rec(arm: str, kind: str, accepted: list[int], **fields) -> Record:
    return Record.from_json(record(arm, "s", arm_kind=kind, num_speculative_tokens=N, accepted=accepted,
                                   steps=len(accepted), **fields))


def test_per_depth_acceptance_counts_only_steps_whose_length_reaches_the_depth():
    chain = _rec("dflash2@N=3", "spec", [3, 1, 0, 2])
    assert depth_acceptance([chain], N) == {"depth_acceptance": [3 / 4, 2 / 3, 1 / 2],
                                            "depth_acceptance_steps": [4, 3, 2]}
    # adaptive: step 3 (accepted 1 of L = 1) does not count at depth 2, which it could not accept
    adaptive = _rec("adaptive@N=3", "adaptive", [3, 1, 0, 1, 2], verify_policy="adaptive",
                    verify_lengths=[3, 3, 2, 1, 3], verify_rows=[4, 4, 3, 2, 4])
    assert depth_acceptance([adaptive], N) == {"depth_acceptance": [4 / 5, 2 / 3, 1 / 2],
                                               "depth_acceptance_steps": [5, 3, 2]}
    m = verify_metrics([adaptive], N)
    assert (m["verify_rows_per_step"], m["forward_rows_per_step"], m["verify_length_mean"]) == (17 / 5, 4.0, 12 / 5)
    # a tree of 3 nodes holds no node deeper than 2
    tree = _rec("tree3@N=3", "tree", [2, 0, 1], verify_policy="tree", tree_budget=3, verify_lengths=[3, 3, 3],
                verify_rows=[3, 3, 3])
    assert depth_acceptance([tree], N) == {"depth_acceptance": [2 / 3, 1 / 2, None],
                                           "depth_acceptance_steps": [3, 2, 0]}
    # through the summary, and for a record written before the verify fields (a chain at N)
    from dflash2.evaluation.analysis.stats import summarize

    ar = Record.from_json(record("ar", "s", tokens=list(range(12)), steps=11, accepted=[0] * 11))
    s = summarize([ar, chain, adaptive, tree], n_resamples=20)
    assert s["per_arm"]["adaptive@N=3"]["overall"]["depth_acceptance"] == [4 / 5, 2 / 3, 1 / 2]
    assert s["per_arm"]["dflash2@N=3"]["overall"]["depth_acceptance"] == [3 / 4, 2 / 3, 1 / 2]
    assert s["per_arm"]["tree3@N=3"]["tree_budget"] == 3 and s["per_arm"]["ar"]["verify_policy"] == "chain"
    assert s["vs_rows"]["adaptive"]["verify_rows"] == [17 / 5] and s["vs_rows"]["tree"]["verify_rows"] == [3.0]


def test_policy_arms_get_their_tau_over_the_best_chain_arm():
    """`vs_best_chain`: the chain arm with the highest pooled tau at the run's temperature is the
    denominator (not the first or the longest), the ratio is the pooled one, and chain arms get none."""
    from dflash2.evaluation.analysis.stats import summarize

    def arm(label, kind, per_sample, **fields):
        return [record(label, f"s{i}", arm_kind=kind, num_speculative_tokens=N, accepted=acc, steps=len(acc),
                       **fields) for i, acc in enumerate(per_sample)]

    samples = 6
    recs = [record("ar", f"s{i}") for i in range(samples)]
    recs += arm("dflash2@N=2", "spec", [[2, 1]] * samples)        # tau 2.5: the best chain
    recs += arm("dflash2@N=3", "spec", [[1, 0]] * samples)        # tau 1.5
    recs += arm("tree8@N=3", "tree", [[3, 2]] * 3 + [[2, 2]] * 3, verify_policy="tree", tree_budget=8,
                verify_lengths=[3, 3], verify_rows=[8, 8])  # tau (4 + 3) / 2 = 3.5, then 3
    summary = summarize(recs, n_resamples=200)
    vs = summary["per_arm"]["tree8@N=3"]["vs_best_chain"]
    assert vs["chain"] == "dflash2@N=2" and vs["n"] == samples
    assert vs["ratio"] == pytest.approx(((7 * 3 + 6 * 3) / 12) / 2.5)
    low, high = vs["ratio_ci"]
    assert low < vs["ratio"] < high  # two kinds of samples: the paired bootstrap has spread
    assert "vs_best_chain" not in summary["per_arm"]["dflash2@N=3"]


def test_verify_fields_are_checked_and_absent_ones_read_as_the_chain():
    bad = [({"verify_policy": "tree", "tree_budget": 4}, "arm kind 'spec' runs 'chain'"),
           ({"verify_policy": "chain", "tree_budget": 4}, "a budget goes with the tree policy"),
           ({"verify_lengths": [3]}, "one value per step"),
           ({"verify_lengths": [3, 0]}, r"\(1, 0\)\] break accepted <= verify length"),
           ({"verify_rows": [4, 0]}, "verify_rows must be >= 1")]
    for fields, match in bad:
        with pytest.raises(ValueError, match=match):
            _rec("dflash2@N=3", "spec", [3, 1], **fields)
    with pytest.raises(ValueError, match="tree_budget=65 outside 1..64"):
        _rec("tree65@N=3", "tree", [3], verify_policy="tree", tree_budget=65)
    old = _rec("dflash2@N=3", "spec", [3, 1])
    assert verify_of(old) == {"policy": "chain", "tree_budget": None, "lengths": [3, 3], "rows": [4, 4],
                              "forward_rows": 4}
    assert "verify_lengths" not in old.to_json()  # written only when set


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    from dflash2.evaluation.analysis.records import read_records
    from dflash2.evaluation.running.run import run_eval

    out = tmp_path_factory.mktemp("verify_policies")
    run_eval(_compose(["experiment=verify_policies_tiny_cpu", f"output_dir={out}", "hardware.num_threads=1"]), out,
             job_name="eval")
    return out, read_records(out / "records.jsonl"), json.loads((out / "summary.json").read_text())


def test_end_to_end_summary_table_and_plot(e2e, capsys):
    out, records, summary = e2e
    assert summary["arms"] == ["ar", "dflash2@N=2", "dflash2@N=3", "adaptive@N=3", "tree4@N=3", "tree8@N=3"]
    assert summary["checks"]["identical_to_ar"]["passed"] and all(r.identical_to_ar for r in records if r.steps
                                                                 and r.arm != "ar")
    per = summary["per_arm"]
    assert [(per[a]["verify_policy"], per[a]["tree_budget"]) for a in summary["arms"][3:]] == [
        ("adaptive", None), ("tree", 4), ("tree", 8)]
    assert per["tree8@N=3"]["overall"]["verify_rows_per_step"] == 8.0
    assert per["adaptive@N=3"]["overall"]["forward_rows_per_step"] == 4.0
    assert per["adaptive@N=3"]["overall"]["verify_rows_per_step"] < 4.0  # an untrained drafter: lengths shrink
    assert {k: v["verify_rows"] for k, v in summary["vs_rows"].items()} == {
        "dflash2": [3.0, 4.0], "adaptive": [per["adaptive@N=3"]["overall"]["verify_rows_per_step"]],
        "tree": [4.0, 8.0]}
    png = (out / "plots" / "tau_speedup_vs_verify_rows.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert 'alt="tau_speedup_vs_verify_rows"' in (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    assert "## Verify policies" in md and "| tree8@N=3 | tree | 3 | 8 | 8.00 | 8.00 |" in md
    from dflash2.evaluation.analysis.report import print_summary

    print_summary(summary)
    assert "verify policies (rows per step" in capsys.readouterr().out


def test_end_to_end_cost_model_prices_policy_rows_with_the_chain_fit(e2e):
    _, _, summary = e2e
    cost = summary["cost_model"]
    fit = cost["step_cost"]["dflash2|T=0"]["fits"]
    (batch, f), = fit.items()
    coef = f["coef"]

    def chain_step(rows: float, ctx: float) -> float:  # c(B, N, ctx) at N + 1 = rows, N > 0
        return (coef["overhead"] + coef["draft"] + coef["per_token"] * rows + coef["kv"] * ctx
                + coef["attention"] * ctx * rows)

    tree, adaptive = cost["arms"]["tree8@N=3"], cost["arms"]["adaptive@N=3"]
    assert (tree["forward_rows"], tree["verify_policy"], tree["tree_budget"]) == (8, "tree", 8)
    assert tree["predicted_step_s"] == pytest.approx(chain_step(8, tree["ctx"]), rel=1e-9)
    assert "ragged_step_s" not in tree and tree["warnings"]  # 8 rows: beyond the chain fit's 1..4
    assert adaptive["forward_rows"] == 4 and adaptive["ragged_rows"] < 4
    assert adaptive["predicted_step_s"] == pytest.approx(chain_step(4, adaptive["ctx"]), rel=1e-9)
    assert adaptive["ragged_step_s"] == pytest.approx(chain_step(adaptive["ragged_rows"], adaptive["ctx"]), rel=1e-9)
    assert adaptive["predicted_tau"] == pytest.approx(summary["per_arm"]["adaptive@N=3"]["overall"]["tau_pooled"])
    assert cost["arms"]["dflash2@N=3"]["forward_rows"] == 4 and "adaptive@N=3" in cost["predictions"]


def test_end_to_end_wandb_keys(e2e):
    from dflash2.evaluation.analysis.wandb_log import RECORD_COLUMNS, _record_rows, build_report, flat_metrics

    _, records, summary = e2e
    flat = flat_metrics(summary)
    assert flat["tree8@N=3/verify_rows_per_step"] == 8.0 and flat["adaptive@N=3/forward_rows_per_step"] == 4.0
    rows = _record_rows(records)
    col = RECORD_COLUMNS.index("verify_rows_per_step")
    assert {row[RECORD_COLUMNS.index("arm")]: row[col] for row in rows}["tree4@N=3"] == 4.0
    pytest.importorskip("wandb_workspaces")
    import wandb_workspaces.reports.v2 as wr

    report = build_report("team/project/run1", summary)
    panels = next(b for b in report.blocks if isinstance(b, wr.PanelGrid)).panels
    bars = {p.title: p for p in panels if isinstance(p, wr.BarPlot)}
    assert set(bars["verify rows per step per arm"].metrics) <= set(flat)
    media = next(p for p in panels if isinstance(p, wr.MediaBrowser))
    assert "plots/tau_speedup_vs_verify_rows" in media.media_keys


# ------------------------------------------------------------------ config


@pytest.mark.parametrize("override, match", [
    ("arms.tree_budgets=[1,16]", r"^arms.tree_budgets=\[1, 16\]: \[1\] outside 2..64 \(nodes of each step's"),
    ("arms.tree_budgets=[16,65]", r"^arms.tree_budgets=\[16, 65\]: \[65\] outside 2..64"),
    ("arms.tree=true arms.tree_budgets=[]", r"^arms.tree=true with arms.tree_budgets=\[\]: give the budgets"),
    ("arms.adaptive_num_speculative_tokens=[0]", r"^arms.adaptive_num_speculative_tokens=\[0\] has values < 1"),
    ("arms.tree_num_speculative_tokens=[3,-1]", r"^arms.tree_num_speculative_tokens=\[3, -1\] has values < 1"),
])
def test_bad_policy_settings_fail_in_one_line(override, match):
    cfg = _compose(["experiment=verify_policies_tiny_cpu", *override.split()])
    with pytest.raises(ValueError, match=match) as err:
        validate(cfg)
    assert "\n" not in str(err.value)


def test_the_qwen05b_verify_plans_eval_and_speed_jobs_compose_and_validate(tmp_path):
    """`python -m dflash2.ablation --plan qwen05b_verify` runs `experiment=verify_policies_qwen05b`
    with `ablation_arm=dflash2` and its speed overrides: every such job's overrides compose against
    the schema and pass the config checks, with the preset's arms."""
    from dflash2.ablation import Ablation, load_plan

    jobs = [j for phase in ("eval", "speed") for j in Ablation(load_plan("qwen05b_verify"), tmp_path).jobs(phase)]
    assert len(jobs) == 6
    for job in jobs:
        overrides = [a for a in job.argv[2:] if a != "hydra.run.dir=."]
        cfg = _compose(overrides)
        validate(cfg)
        labels = [a.label for a in build_arms(cfg.arms, has_draft=True, draft_has_selector=True)]
        assert labels[-4:] == ["adaptive@N=15", "tree16@N=15", "tree32@N=15", "tree64@N=15"], job.name
        assert not cfg.arms.selector_off


def test_policy_presets_and_a_misspelt_switch():
    cfg = _compose(["experiment=verify_policies_qwen05b"])
    validate(cfg)
    assert (list(cfg.arms.num_speculative_tokens), list(cfg.arms.adaptive_num_speculative_tokens),
            list(cfg.arms.tree_num_speculative_tokens), list(cfg.arms.tree_budgets)) == ([3, 7, 15], [15], [15],
                                                                                         [16, 32, 64])
    assert cfg.draft.block_size == 16 and cfg.data.limit == 500 and cfg.target.name == "qwen2.5-coder-0.5b"
    labels = [a.label for a in build_arms(cfg.arms, has_draft=True, draft_has_selector=True)]
    assert labels == ["ar", "dflash2@N=3", "dflash2@N=7", "dflash2@N=15", "adaptive@N=15", "tree16@N=15",
                      "tree32@N=15", "tree64@N=15"]
    assert not _compose(["experiment=tiny_cpu"]).arms.tree  # off by default
    with pytest.raises(Exception, match="tree_budget"):
        _compose(["experiment=tiny_cpu", "arms.tree_budget=[16]"])
    assert Arm("tree16@N=15", "tree", 15, 16).verify == "tree"
