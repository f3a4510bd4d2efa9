"""The runner: oracle and selector-off arms through the real engine, per-sample seeds,
departure margins, torn records, run identity on resume, and `eval/run.py experiment=tiny_cpu`
end to end (SIGKILLed mid-run, a torn last line added, resumed: the records equal an
uninterrupted run's and none written before the kill is lost; W&B offline for real); the
end-to-end time per arm covers exactly the records a process generated."""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.evaluation.arms import SelectorOffProposer, build_arms
from dflash2.evaluation.running.config import ArmsSpec
from dflash2.evaluation.arms.oracle_proposers import OracleProposer
from dflash2.evaluation.analysis.records import Record, read_records
from dflash2.evaluation.running.runner import sample_seed
from dflash2.jsonl import TornLineWarning
from tests.conftest import randomize_, tiny_draft_config, tiny_qwen3
from tests.evaluation.synthetic import record

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 42, 8], [100, 3, 250, 7, 9, 11]]


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(vocab=300, seed=0).float()


def _ar(target, prompt, n=20):
    return speculative_generate(target, None, [prompt], max_new_tokens=n).generated[0].tolist()


@pytest.mark.parametrize("p, n", [(1.0, 4), (0.0, 4), (0.6, 3)])
def test_oracle_controls_acceptance_and_stays_lossless(target, p, n):
    for prompt in PROMPTS:
        ar = _ar(target, prompt)
        oracle = OracleProposer([prompt + ar], [sample_seed(0, "x")], block_size=n + 1, accept_prob=p, vocab_size=300)
        out = speculative_generate(target, oracle, [prompt], max_new_tokens=20, num_speculative_tokens=n)
        assert out.generated[0].tolist() == ar  # greedy verification: never changes the output
        acc = out.accepted[0]
        if p == 1.0:
            assert all(a == n for a in acc[:-1])  # all but the budget-truncated last step
        elif p == 0.0:
            assert sum(acc) == 0
        else:
            assert 0 < sum(acc) < n * len(acc)


def test_oracle_is_exact_when_sampling(target):
    # T > 0: q = [p, 1-p] over [right, wrong] is the oracle's true law; the engine must accept
    # it without error and produce a valid continuation of the right length.
    prompt = PROMPTS[0]
    ar = speculative_generate(target, None, [prompt], max_new_tokens=12, temperature=1.0, seed=3).generated[0].tolist()
    oracle = OracleProposer([prompt + ar], [3], block_size=4, accept_prob=0.7, vocab_size=300)
    out = speculative_generate(target, oracle, [prompt], max_new_tokens=12, num_speculative_tokens=3,
                               temperature=1.0, seed=3)
    assert len(out.generated[0]) == 12 and all(0 <= a <= 3 for a in out.accepted[0])


def test_selector_off_is_the_v1_path_on_the_same_weights(target):
    cfg = tiny_draft_config(v2=True, vocab=300, block_size=6, selector_top_k=4)
    from dflash2.modeling import DFlash2DraftModel

    draft = randomize_(DFlash2DraftModel(cfg), seed=2, std=0.3).eval()
    no_selector = copy.deepcopy(draft)
    no_selector.candidate_selector = None  # the engine's v1 branch (argmax per slot), conv kept
    for prompt in PROMPTS:
        ar = _ar(target, prompt)
        off = speculative_generate(target, SelectorOffProposer(draft, target_as(target), "torch"), [prompt],
                                   max_new_tokens=20, num_speculative_tokens=5)
        ref = speculative_generate(target, no_selector, [prompt], max_new_tokens=20, num_speculative_tokens=5)
        assert off.generated[0].tolist() == ar == ref.generated[0].tolist()
        assert off.accepted == ref.accepted


def target_as(model):
    from dflash2.target import as_target

    return as_target(model)


def test_arms_and_seeds():
    labels = [a.label for a in build_arms(ArmsSpec(num_speculative_tokens=[7, 3], oracle=True,
                                                   oracle_num_speculative_tokens=[3]), has_draft=True,
                                          draft_has_selector=True)]
    assert labels == ["ar", "dflash2@N=3", "dflash2@N=7", "selector_off@N=3", "selector_off@N=7", "oracle@N=3"]
    v1 = [a.label for a in build_arms(ArmsSpec(num_speculative_tokens=[3]), has_draft=True, draft_has_selector=False)]
    assert v1 == ["ar", "dflash2@N=3"]
    assert sample_seed(0, "gsm8k/0001") == sample_seed(0, "gsm8k/0001") != sample_seed(0, "gsm8k/0002")
    assert sample_seed(1, "gsm8k/0001") != sample_seed(0, "gsm8k/0001")


def test_torn_last_record_is_dropped(tmp_path):
    p = tmp_path / "records.jsonl"
    p.write_text(json.dumps(record("ar", "a")) + "\n" + '{"arm": "ar", "samp')
    with pytest.warns(TornLineWarning):
        assert [r.sample_id for r in read_records(p, repair=True)] == ["a"]
    assert p.read_text().endswith("}\n")  # appending continues on a clean line


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from tests.evaluation.test_eval_configs import _compose

    from dflash2.evaluation.running.runner import EvalRunner

    out = tmp_path_factory.mktemp("run")
    cfg = _compose(["experiment=tiny_cpu", f"output_dir={out}", "data.limit=1", "max_new_tokens=6"])
    return EvalRunner(cfg, out)


def test_departure_margin_is_the_targets_top2_gap_on_the_ar_prefix(runner):
    prompt, ar = [9707, 11, 1879], [13, 1576, 374, 264]
    got_ar = runner._compare(True, "s", ar, prompt, None)
    assert got_ar["identical_to_ar"] is None and got_ar["departure"] is None and got_ar["logprob_mean"] < 0
    rec_ar = Record.from_json(record("ar", "s", tokens=ar, steps=0, accepted=[], **got_ar))
    spec = runner._compare(False, "s", ar[:2] + [7, 7], prompt, rec_ar)
    with torch.no_grad():
        logits = runner.target(torch.tensor([prompt + ar[:2]]), logits_to_keep=1).logits[0, -1].float()
    top = torch.topk(logits, 2)
    assert spec["identical_to_ar"] is False
    assert spec["departure"]["position"] == 2 and spec["departure"]["top1"] == int(top.indices[0])
    assert spec["departure"]["margin"] == pytest.approx(float(top.values[0] - top.values[1]), abs=1e-4)
    same = runner._compare(False, "s", list(ar), prompt, rec_ar)
    assert same == {"identical_to_ar": True, "departure": None, "logprob_mean": rec_ar.logprob_mean}


def test_changed_config_refuses_to_append(runner, tmp_path):
    from dflash2.entrypoint import UserError

    runner.out = tmp_path
    runner._check_identity(resume=False)
    assert not (tmp_path / "run.json").exists()       # the check writes nothing; the run writes it once it began
    runner._write_run_json()
    runner._check_identity(resume=True)              # the same config passes
    (tmp_path / "records.jsonl").write_text("")
    old, before = runner.run_id, runner.identity["max_new_tokens"]
    runner.run_id = "0" * 16
    runner.identity = {**runner.identity, "max_new_tokens": 99, "arms": {**runner.identity["arms"], "oracle": False}}
    with pytest.raises(UserError, match=rf"holds run {old}, made with another config .*\(changed: arms.oracle: True "
                       rf"-> False; max_new_tokens: {before} -> 99\); to continue it, rerun with its values and "
                       "resume=true, or choose a new output_dir"):
        runner._check_identity(resume=True)


def test_changed_keys_walks_nested_identities():
    from dflash2.evaluation.running.config import changed_keys

    old = {"arms": {"num_speculative_tokens": [99], "oracle": True}, "seed": 0, "gone": 1}
    new = {"arms": {"num_speculative_tokens": [3], "oracle": True}, "seed": 0, "added": 2}
    assert changed_keys(old, new) == [("added", None, 2), ("arms.num_speculative_tokens", [99], [3]),
                                      ("gone", 1, None)]
    assert changed_keys(new, new) == []


TINY = ["experiment=tiny_cpu", "data.limit=1", "max_new_tokens=8"]


def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "eval" / "run.py"), *TINY, f"output_dir={out}", *extra]


def _uninterrupted(out: Path) -> Path:
    """The same evaluation run once without interruption (in this process, through `run_eval`;
    one thread, as the subprocesses run with OMP_NUM_THREADS=1)."""
    from tests.evaluation.test_eval_configs import _compose

    from dflash2.evaluation.running.run import run_eval

    return run_eval(_compose([*TINY, f"output_dir={out}", "hardware.num_threads=1"]), out, job_name="eval")


def test_tiny_cpu_end_to_end_killed_and_resumed(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    proc = subprocess.Popen(_cli(out), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rec = out / "records.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if rec.exists() and rec.read_text().count("\n") >= 5:
            break
        time.sleep(0.2)
    assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with open(rec, "a") as f:
        f.write('{"arm": "dflash2@N=3", "sample_id": "gsm8k/00')  # the torn write of a killed process
    with pytest.warns(TornLineWarning):
        before = read_records(rec)  # read only: the torn line is skipped, the file left for the resume

    from dflash2.runconfig import prepare_output_dir

    with pytest.raises(FileExistsError, match="resume=true"):  # the rule eval/run.py applies first
        prepare_output_dir(out, resume=False, job_name="eval")

    done = subprocess.run(_cli(out, "resume=true", "logger=offline"), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_records(rec)
    pairs = [(r.arm, r.sample_id) for r in records]
    assert len(pairs) == len(set(pairs)) == 4 * 4  # 4 samples (MT-Bench: 2 turns) x 4 arms, none twice
    assert records[: len(before)] == before  # finished records were kept, not redone
    assert {r.dataset for r in records} == {"gsm8k", "humaneval", "mt_bench"}
    # Every arm of one chunk carries that chunk's batch key, so speedup CIs resample batches.
    batches = {}
    for r in records:
        batches.setdefault(r.sample_id, set()).add(r.batch)
    assert all(len(b) == 1 for b in batches.values()), batches
    # T = 0, fp32 on CPU: every speculative arm reproduces the AR tokens.
    assert all(r.identical_to_ar for r in records if r.arm_kind != "ar")
    # The killed-and-resumed run equals an uninterrupted one: the same (arm, sample) records with
    # the same tokens, acceptance, correctness and text (wall times differ).
    from dflash2.evaluation.running.sharding import compare_runs

    same = compare_runs(_uninterrupted(tmp_path / "whole"), out, fields=("tokens", "accepted", "correct",
                                                                          "finish_reason", "text", "batch"))
    assert same["equal"] and same["n_compared"] == 16, json.dumps(same, indent=1)
    oracle = [r for r in records if r.arm_kind == "oracle"]
    assert sum(map(sum, (r.accepted for r in oracle))) / sum(r.steps for r in oracle) >= 1.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks"]["oracle_min_accepted"]["passed"] and summary["checks"]["identical_to_ar"]["passed"]
    # The resumed process timed only what it generated; the killed one's records are not timed.
    assert summary["end_to_end"]["samples"] == len(records) - len(before)
    assert done.stdout.count("ms/token end to end") == 4
    assert (out / "report.html").stat().st_size > 1000 and (out / "run.json").exists()

    from dflash2.evaluation.analysis.wandb_log import read_offline_run

    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert runs, "logger=offline wrote no W&B run directory"
    logged = read_offline_run(str(runs[-1]))["summary"]
    tau = summary["per_arm"]["oracle@N=3"]["overall"]["tau_pooled"]
    assert logged["oracle@N=3/tau_pooled"] == pytest.approx(tau)


def _e2e_run(out: Path, capsys, resume: bool) -> tuple[dict, str]:
    """A tiny in-process run (or resume) of `TINY`: its summary.json and what it printed."""
    from tests.evaluation.test_eval_configs import _compose

    from dflash2.evaluation.running.run import run_eval

    capsys.readouterr()
    run_eval(_compose([*TINY, f"output_dir={out}", "hardware.num_threads=1", f"resume={str(resume).lower()}"]), out,
             job_name="eval")
    return json.loads((out / "summary.json").read_text()), capsys.readouterr().out


def test_end_to_end_time_covers_the_records_this_process_generated(tmp_path, capsys):
    out = tmp_path / "run"
    summary, printed = _e2e_run(out, capsys, resume=False)
    records = read_records(out / "records.jsonl")
    e2e = summary["end_to_end"]
    assert list(e2e["per_arm"]) == summary["arms"] and (e2e["rank"], e2e["world_size"]) == (0, 1)
    assert e2e["samples"] == len(records) == 16
    for arm, e in e2e["per_arm"].items():
        mine = [r for r in records if r.arm == arm]
        assert e["samples"] == len(mine) == 4 and e["chunks"] == 4  # batch_size 1: one chunk per sample
        assert e["tokens"] == sum(len(r.tokens) for r in mine) > 0
        # Nested intervals of one clock: the chunk holds the call, the scorers and the extra forwards.
        assert e["generation_s"] == pytest.approx(sum(r.wall_s for r in mine), rel=1e-9)
        assert e["total_s"] >= e["generation_s"] + e["score_s"] + e["analysis_s"] and e["generation_s"] > 0
        # End to end is the arm's own work: scoring and the analysis forwards are apart.
        assert e["serve_s"] == pytest.approx(e["total_s"] - e["score_s"] - e["analysis_s"])
        assert e["host_s"] == pytest.approx(e["serve_s"] - e["generation_s"])
        assert e["ms_per_token"] == pytest.approx(1e3 * e["serve_s"] / e["tokens"])
        assert e["ms_per_token"] >= e["generation_ms_per_token"] > 0 and 0 <= e["host_fraction"] <= 1
        assert e["ms_per_sample"] == pytest.approx(1e3 * e["serve_s"] / 4)
        # Generation = the calls' prefills + their steps (a row's steps, plus at most one lookahead step
        # per call); on the CPU every step is eager and nothing is captured.
        assert 0 < e["prefill_s"] < e["generation_s"]
        assert e["prefill_ms_per_call"] == pytest.approx(1e3 * e["prefill_s"] / 4)
        assert sum(r.steps for r in mine) <= e["steps"] <= sum(r.steps for r in mine) + 4
        assert e["decode_ms_per_step"] == pytest.approx(1e3 * (e["generation_s"] - e["prefill_s"]) / e["steps"])
        assert e["eager_steps_per_call"] == pytest.approx(e["steps"] / 4) and e["graph_captures"] == 0
        # Every record was generated here, so the generation speedup is the summary's headline one.
        base = e2e["per_arm"][e2e["baseline"]]
        assert e["generation_speedup"] == pytest.approx(summary["per_arm"][arm]["overall"]["speedup"], rel=1e-9)
        assert e["speedup_end_to_end"] == pytest.approx(base["serve_s"] / e["serve_s"], rel=1e-9)
        line = next(ln for ln in printed.splitlines() if ln.startswith(f"  {arm} "))
        assert f"{e['ms_per_token']:.3f} ms/token end to end" in line and "4 samples" in line
        assert f"decode {e['decode_ms_per_step']:.3f} ms/step" in line
        assert (f"speedup {e['speedup_end_to_end']:.3f} end to end" in line) == (arm != e2e["baseline"])
    assert "End to end per arm" in (out / "report.html").read_text()
    # What every arm ran under, as the engine resolved it (the CPU: reference kernels, no graphs).
    assert list(summary["engine"]) == summary["arms"]
    for e in summary["engine"].values():
        assert (e["linear_impl"], e["exact"], e["graphs"], e["graph_error"], e["varied"]) == ("torch", False, False,
                                                                                              None, [])
        assert e["verify"] == "chain" and e["kernel_impl"] in ("torch", "triton")
    line = next(ln for ln in printed.splitlines() if ln.startswith("engine (every arm): "))
    assert "linear torch" in line and "graphs off" in line and "exact off" in line
    assert "Engine settings per arm" in (out / "report.html").read_text()

    # Resumed after losing the last 5 records: only those 5 are generated, and only they are timed.
    lines = (out / "records.jsonl").read_text().splitlines(keepends=True)
    (out / "records.jsonl").write_text("".join(lines[:-5]))
    lost = [json.loads(ln)["arm"] for ln in lines[-5:]]
    summary, _ = _e2e_run(out, capsys, resume=True)
    assert len(read_records(out / "records.jsonl")) == 16
    assert {a: e["samples"] for a, e in summary["end_to_end"]["per_arm"].items()} == {a: lost.count(a)
                                                                                     for a in summary["arms"]}

    # Resumed with nothing left to do: 0 samples timed, NaN rates as null, the line still printed.
    summary, printed = _e2e_run(out, capsys, resume=True)
    e2e = summary["end_to_end"]
    assert e2e["samples"] == 0 and summary["n_samples"] == 4
    for arm, e in e2e["per_arm"].items():
        assert (e["samples"], e["tokens"], e["total_s"]) == (0, 0, 0.0)
        assert e["ms_per_token"] is None and e["ms_per_sample"] is None and e["host_fraction"] is None
        assert e["speedup_end_to_end"] is None and e["generation_speedup"] is None
        assert f"  {arm} " in printed
    assert printed.count("- ms/token end to end (0 samples timed)") == len(e2e["per_arm"])


def test_checks_pass_fail_and_skip_when_sampling():
    from dflash2.evaluation.running.config import ChecksSpec
    from dflash2.evaluation.running.runner import run_checks

    def rec(arm, kind, acc, same, t=0.0):
        n = int(arm.split("@N=")[1]) if "@N=" in arm else 0
        return record(arm, "s", arm_kind=kind, accepted=acc, steps=len(acc), identical_to_ar=same, temperature=t,
                      num_speculative_tokens=n)

    checks = ChecksSpec(oracle_min_accepted=1.0, require_identical=True)
    good = [rec("ar", "ar", [0, 0], None), rec("oracle@N=3", "oracle", [3, 1], True)]
    out = run_checks(good, checks)
    assert out["oracle_min_accepted"]["passed"] and out["identical_to_ar"]["passed"]
    bad = [rec("ar", "ar", [0], None), rec("oracle@N=3", "oracle", [0, 1], False)]
    out = run_checks(bad, checks)
    assert out["oracle_min_accepted"]["passed"] is False and out["identical_to_ar"]["passed"] is False
    assert out["identical_to_ar"]["differing"] == ["oracle@N=3:s"]
    drafted = ChecksSpec(draft_min_accepted=1.0)
    runs = [rec("ar", "ar", [0, 0], None), rec("dflash2@N=7", "spec", [3, 0], True),
            rec("selector_off@N=7", "selector_off", [1, 2], True)]
    out = run_checks(runs, drafted)
    assert out["draft_mean_accepted_per_step"] == {"dflash2@N=7": 1.5, "selector_off@N=7": 1.5}
    assert out["draft_min_accepted"]["passed"]
    runs[1]["accepted"] = [0, 1]  # a drafter whose drafts are mostly rejected: identity would be near trivial
    assert run_checks(runs, drafted)["draft_min_accepted"]["passed"] is False
    assert run_checks([{**r, "temperature": 1.0} for r in runs], drafted)["draft_min_accepted"]["skipped"] == "T > 0"
    runs[1]["accepted"] = [3, 0]
    one = [rec("dflash2@N=1", "spec", [1, 0], True), *runs]  # N = 1 reaches 1.0 only by accepting every draft
    out = run_checks(one, drafted)["draft_min_accepted"]
    assert out["passed"] and out["not_checked"] == ["dflash2@N=1"]
    one_drafted = [r for r in one if r["arm"] in ("ar", "dflash2@N=1")]
    assert run_checks(one_drafted, drafted)["draft_min_accepted"]["passed"] is False
    empty = [rec("ar", "ar", [], None), rec("oracle@N=3", "oracle", [], True)]  # no steps: nothing measured
    out = run_checks(empty, checks)
    assert out["oracle_min_accepted"]["passed"] is False
    from dflash2.evaluation.analysis.stats import to_jsonable

    assert to_jsonable(out)["oracle_mean_accepted_per_step"] == {"oracle@N=3": None}  # NaN goes to JSON as null
    sampled = [dict(r, temperature=1.0) for r in bad]
    out = run_checks(sampled, checks)
    assert out["oracle_min_accepted"]["passed"] is None and out["oracle_min_accepted"]["skipped"] == "T > 0"


def test_draft_trained_on_another_prompt_format_warns_loudly(runner, tmp_path, capsys):
    from tests.evaluation.test_eval_configs import _compose

    from dflash2.evaluation.running.runner import EvalRunner, draft_training_format_hash

    ckpt = tmp_path / "draft"
    runner.draft.save_pretrained(ckpt)
    cfg_json = json.loads((ckpt / "config.json").read_text())
    cfg_json["dflash2_training"] = {"format_hash": "0123456789abcdef", "steps": 10}
    (ckpt / "config.json").write_text(json.dumps(cfg_json))
    assert draft_training_format_hash(str(ckpt)) == "0123456789abcdef"
    cfg = _compose(["experiment=tiny_cpu", f"output_dir={tmp_path / 'o'}", f"draft_path={ckpt}"])
    other = EvalRunner(cfg, tmp_path / "o")
    err = capsys.readouterr().out
    assert "PROMPT FORMAT MISMATCH" in err and "0123456789abcdef" in err and other.fmt.hash in err
    assert other.run_id != runner.run_id  # the checkpoint is part of the run identity
    cfg_json["dflash2_training"]["format_hash"] = other.fmt.hash
    (ckpt / "config.json").write_text(json.dumps(cfg_json))
    assert draft_training_format_hash(str(ckpt)) == other.fmt.hash


def test_a_samples_draws_depend_on_its_id_only(runner):
    from dflash2.evaluation.running import datasets as ds
    from dflash2.evaluation.arms import Arm

    items = [(it, 1) for it in ds.load_items("gsm8k", source="local", limit=2)]
    ar = Arm("ar", "ar", 0)
    old_t, old_n = runner.cfg.temperature, runner.cfg.max_new_tokens
    try:
        runner.cfg.max_new_tokens = 6
        runner.cfg.temperature = 0.0  # T = 0: a batch of two equals two batches of one
        pair = runner._run_arm(ar, items, {})
        singles = [runner._run_arm(ar, [x], {})[0] for x in items]
        assert [r.tokens for r in pair] == [r.tokens for r in singles]
        runner.cfg.temperature = 1.0  # sampled: the same draws whatever ran before (order, resume)
        first = runner._run_arm(ar, [items[1]], {})[0]
        runner._run_arm(ar, [items[0]], {})
        again = runner._run_arm(ar, [items[1]], {})[0]
        assert first.tokens == again.tokens and first.seed == again.seed
        assert runner._run_arm(ar, [items[0]], {})[0].seed != first.seed
        # Sampled and batched: each row draws with its own sample's seed, as when run alone.
        pair = runner._run_arm(ar, items, {})
        singles = [runner._run_arm(ar, [x], {})[0] for x in items]
        assert [r.tokens for r in pair] == [r.tokens for r in singles]
    finally:
        runner.cfg.temperature, runner.cfg.max_new_tokens = old_t, old_n


def test_every_arm_of_an_exact_run_gets_the_same_padded_width(tmp_path):
    """Exact mode compares arms bit for bit only when all run at one padded width: a block-8
    drafter, its selector-off twin, an oracle at N = 3 and the AR arm (no draft) all record 8."""
    from tests.evaluation.test_eval_configs import _compose

    from dflash2.evaluation.running.run import run_eval

    out = tmp_path / "exact"
    cfg = _compose(["experiment=tiny_cpu", "draft.block_size=8", "exact=true", "data.limit=1",
                    "data.datasets=[gsm8k,humaneval]", "max_new_tokens=6", f"output_dir={out}"])
    run_eval(cfg, out, job_name="eval")
    recs = read_records(out / "records.jsonl")
    assert {r.arm_kind for r in recs} == {"ar", "spec", "selector_off", "oracle"}
    assert {r.arm: r.exact_block_size for r in recs} == {r.arm: 8 for r in recs}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exact_block_size"] == 8 and summary["exact"] is True and summary["exact_impl"] == "rows"
    assert {r.exact_impl for r in recs} == {"rows"}  # as resolved (auto = rows on a CPU)
    assert all(r.identical_to_ar for r in recs if r.arm_kind != "ar")
    n_spec = sum(r.arm_kind != "ar" for r in recs)
    assert (f"Greedy: {n_spec} speculative records, all bit-identical to the AR arm; exact mode on (every forward 8 "
            "wide, exact_impl rows)." in (out / "report.md").read_text())


def test_exact_width_widens_to_the_largest_verify_block():
    from dflash2.evaluation.arms import Arm
    from dflash2.evaluation.running.runner import exact_width

    class Draft:
        block_size = 8

    arms = [Arm("ar", "ar", 0), Arm("dflash2@N=7", "spec", 7), Arm("oracle@N=15", "oracle", 15)]
    assert exact_width(arms, Draft()) == 16
    assert exact_width(arms[:2], Draft()) == 8
    assert exact_width([Arm("ar", "ar", 0), Arm("oracle@N=3", "oracle", 3)], None) == 4
    # The runner applies the engine's one rule (also the preflight's and speculative_generate's default).
    from dflash2.engine.inputs import exact_width as engine_exact_width

    assert engine_exact_width(8) == 8 and engine_exact_width(8, [0, 15]) == 16 and engine_exact_width(None) is None


def test_summary_reads_exact_mode_from_the_records():
    """The exact mode a run resolved is recorded once, in its records; the summary reads it there
    (a record has a width exactly when it ran in exact mode)."""
    from dflash2.evaluation.analysis.records import exact_of_records

    def rec(width, impl):
        return Record.from_json(record("ar", "s", exact_block_size=width, exact_impl=impl))

    off = rec(None, None)
    assert exact_of_records([off, off]) == {"exact_block_size": None, "exact": False, "exact_impl": None}
    rows = rec(8, "rows")
    assert exact_of_records([rows, rows]) == {"exact_block_size": 8, "exact": True, "exact_impl": "rows"}
    mixed = [rows, rec(16, "invariant")]
    assert exact_of_records(mixed) == {"exact_block_size": [8, 16], "exact": True, "exact_impl": ["invariant", "rows"]}


def test_exact_auto_is_on_for_greedy_runs_on_cuda():
    """`exact: null` (auto) resolves per run: on (invariant) for greedy on CUDA where the kernels fit
    and the compile level is auto, light or null; off for sampling, on a CPU, at compile level full
    or with exact_impl=rows; an explicit true/false wins."""
    from types import SimpleNamespace

    pytest.importorskip("triton")
    from dflash2.evaluation.running.runner import resolve_exact
    from tests.engine.helpers import tiny_qwen3

    config = tiny_qwen3(vocab=300, hidden=64, layers=2, seed=0).config

    def cfg(**kw):
        base = dict(exact=None, exact_impl="auto", compile_level="auto", temperature=0.0)
        return SimpleNamespace(**{**base, **kw})

    cuda = SimpleNamespace(device=torch.device("cuda"), config=config)
    cpu = SimpleNamespace(device=torch.device("cpu"), config=config)
    assert resolve_exact(cfg(), cuda, 8) == (True, "invariant")
    for on in (cfg(exact_impl="invariant"), cfg(compile_level="light"), cfg(compile_level=None)):
        assert resolve_exact(on, cuda, 8) == (True, "invariant")
    for off in (cfg(temperature=0.7), cfg(compile_level="full"), cfg(exact_impl="rows"), cfg(exact=False)):
        assert resolve_exact(off, cuda, 8) == (False, None)
    assert resolve_exact(cfg(), cuda, 4096) == (False, None)  # a width the row-attention kernel does not take
    assert resolve_exact(cfg(), cpu, 8) == (False, None)
    assert resolve_exact(cfg(exact=True), cpu, 8) == (True, "rows")


def test_greedy_evaluations_default_to_exact_mode_on_cuda():
    """eval/run.py's default is `exact: null`: a greedy run of any preset not compiled at "full"
    resolves to exact mode on CUDA and to the normal mode on a CPU; `exact=false` opts out."""
    from types import SimpleNamespace

    pytest.importorskip("triton")
    from dflash2.evaluation.running.runner import resolve_exact
    from tests.evaluation.test_eval_configs import _compose

    config = tiny_qwen3(vocab=300, hidden=64, layers=2, seed=0).config
    cuda = SimpleNamespace(device=torch.device("cuda"), config=config)
    for preset in ("tiny_cpu", "smollm2_gpu", "quickstart_gpu"):
        cfg = _compose([f"experiment={preset}"])
        assert cfg.exact is None and float(cfg.temperature) == 0.0
        assert resolve_exact(cfg, cuda, 8) == ((True, "invariant") if cfg.compile_level != "full" else (False, None))
        assert resolve_exact(cfg, SimpleNamespace(device=torch.device("cpu"), config=config), 8) == (False, None)
    assert resolve_exact(_compose(["experiment=tiny_cpu", "exact=false"]), cuda, 8) == (False, None)
