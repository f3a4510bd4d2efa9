"""The arm registry (`dflash2.evaluation.arms`): the six kinds it ships, and a new kind added as
one registration is built, recorded, ordered, paired, checked and costed without touching any
other evaluation module."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dflash2.evaluation import arms as registry
from dflash2.evaluation.arms import ArmKind, build_arms, draft_for_arm, kind_names
from dflash2.evaluation.running.config import ArmsSpec
from dflash2.evaluation.analysis.records import Record
from tests.evaluation.synthetic import synthetic_records


def test_the_shipped_kinds_and_what_they_declare():
    assert kind_names() == ("ar", "spec", "selector_off", "adaptive", "tree", "oracle")
    assert registry.baseline().name == "ar" and registry.primary_kind() == "spec"
    assert registry.drafter_kinds() == ("spec", "selector_off", "adaptive", "tree")
    assert {k.name: k.verify for k in registry.registered() if k.verify != "chain"} == {"adaptive": "adaptive",
                                                                                        "tree": "tree"}
    cfg = ArmsSpec(oracle=True, num_speculative_tokens=[3, 1, 3], oracle_num_speculative_tokens=[7])
    labels = [a.label for a in build_arms(cfg, has_draft=True, draft_has_selector=True)]
    assert labels == ["ar", "dflash2@N=1", "dflash2@N=3", "selector_off@N=1", "selector_off@N=3", "oracle@N=7"]
    v1 = [a.label for a in build_arms(cfg, has_draft=True, draft_has_selector=False)]  # no selector: no selector-off
    assert v1 == ["ar", "dflash2@N=1", "dflash2@N=3", "oracle@N=7"]
    assert [a.label for a in build_arms(cfg, has_draft=False, draft_has_selector=False)] == ["ar", "oracle@N=7"]


def test_a_clashing_registration_is_refused():
    with pytest.raises(ValueError, match="clashes with 'oracle'"):
        registry.register(ArmKind(name="oracle2", family="oracle", flag="oracle2", order=9,
                                  make_draft=lambda arm, ctx: None))
    with pytest.raises(ValueError, match="unknown arm kind 'nope'"):
        registry.kind_of("nope")


@pytest.fixture
def echo_kind(monkeypatch):
    """A new kind, `echo@N=n`: a drafter ablation with its own flag, registered for one test."""
    made = []
    kind = ArmKind(name="echo", family="echo", flag="echo", order=5, uses_draft=True, accept_check="draft",
                   make_draft=lambda arm, ctx: made.append((arm.label, ctx.draft)) or "echo-draft")
    monkeypatch.setitem(registry._REGISTRY, "echo", kind)
    return made


def _as_echo(recs: list[dict]) -> list[dict]:
    """The synthetic run's selector-off records relabelled as the echo arm."""
    return [{**r, "arm": r["arm"].replace("selector_off", "echo"), "arm_kind": "echo"}
            if r["arm_kind"] == "selector_off" else r for r in recs]


def test_a_new_kind_is_one_registration(echo_kind):
    from dflash2.evaluation.analysis import stats
    from dflash2.evaluation.analysis.cost import for_report
    from dflash2.evaluation.running.runner import run_checks

    cfg = SimpleNamespace(ar=True, dflash2=True, selector_off=False, oracle=False, adaptive=False, tree=False,
                          echo=True, num_speculative_tokens=[2], oracle_num_speculative_tokens=None)
    arms = build_arms(cfg, has_draft=True, draft_has_selector=True)
    assert [a.label for a in arms] == ["ar", "dflash2@N=2", "echo@N=2"]
    assert draft_for_arm(arms[-1], draft="the-draft", target=None, impl="torch") == "echo-draft"
    assert echo_kind == [("echo@N=2", "the-draft")]

    recs = _as_echo(synthetic_records(n_per_dataset=4, ns=(3, 7), selector_off=True))
    Record.from_json(next(r for r in recs if r["arm_kind"] == "echo"))  # a valid record kind
    summary = stats.summarize(recs, n_resamples=50)
    assert summary["arms"] == ["ar", "dflash2@N=3", "dflash2@N=7", "echo@N=7"]  # after spec, by its order
    assert summary["per_arm"]["echo@N=7"]["overall"]["n_paired"] == 12  # paired with the AR arm
    assert "echo" in summary["vs_n"]
    checks = run_checks(recs, SimpleNamespace(oracle_min_accepted=None, draft_min_accepted=0.5,
                                              require_identical=False))
    assert "echo@N=7" in checks["draft_min_accepted"]["measured"]
    cost, _ = for_report(recs)
    assert "echo|T=0" in cost["skipped"] and "echo@N=7" not in cost["arms"]  # one N: no step-cost fit of its own
