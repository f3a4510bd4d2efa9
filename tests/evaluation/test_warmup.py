"""The evaluation's untimed warm-up (`dflash2.evaluation.running.warmup`): which calls it makes,
that the runner makes them with each arm's own engine settings before the timed calls, that
no arm's timing counts them, and that they change no record."""

import json
from types import SimpleNamespace

import pytest

from dflash2.engine.generate import PREFILL_BUCKET
from dflash2.evaluation.analysis.records import read_records
from dflash2.evaluation.running.warmup import WARM_FIRST_STEP_TOKENS, Warmup, synthetic_prompt, warm_lengths


def test_warm_lengths_step_down_from_the_longest_to_the_shortest():
    assert warm_lengths(100, 300, 512) == [300, 100]
    assert warm_lengths(100, 1200, 512) == [1200, 688, 176, 100]
    assert warm_lengths(7, 7, 16) == [7]
    for bad in [(0, 5, 4), (6, 5, 4), (1, 5, 0)]:
        with pytest.raises(ValueError):
            warm_lengths(*bad)
    assert synthetic_prompt([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1] and synthetic_prompt([4, 5], 1) == [4]


def _arm(label: str, references: bool = False):
    return SimpleNamespace(label=label, spec=SimpleNamespace(needs_references=references))


def _recorder():
    calls = []
    return calls, (lambda arm, prompts, n, stops: calls.append((arm.label, [len(p) for p in prompts], n, stops)))


def test_phase_and_chunk_calls():
    calls, generate = _recorder()
    arms = [_arm("ar"), _arm("d@N=3"), _arm("oracle@N=3", references=True)]
    w = Warmup(generate, arms, max_new_tokens=64, n_stops=2, vocab=100, clock=lambda: 0.0)
    prompts = [[1] * 10, [2] * 150, [3] * 40]
    w.phase(2, prompts)
    # Every arm but the oracle, longest prompt first, stepping down by max_new_tokens to the shortest,
    # two rows each, the run's stop count with the vocabulary's last id.
    lengths = [150, 86, 22, 10]
    assert calls == [(a, [n, n], 64, [99, 99]) for n in lengths for a in ("ar", "d@N=3")]
    calls.clear()
    w.chunk(prompts[:2], [7, 8])  # a new prompt class: each arm's prefill and first step on these prompts
    assert calls == [(a, [10, 150], WARM_FIRST_STEP_TOKENS, [7, 8]) for a in ("ar", "d@N=3")]
    calls.clear()
    w.chunk([[5] * 149, [6] * 3], [7, 8])  # same row bucket, same prompt bucket: nothing
    assert calls == []
    w.chunk([[5] * (PREFILL_BUCKET * 3 + 1), [6] * 3], [7, 8])  # a longer prompt bucket
    assert [c[1] for c in calls] == [[PREFILL_BUCKET * 3 + 1, 3]] * 2
    calls.clear()
    w.chunk([[1] * 40], None)  # the last, one-row chunk: its row bucket gets the phase's calls, then its class
    assert calls == [(a, [n], 64, [99, 99]) for n in lengths for a in ("ar", "d@N=3")] + \
        [(a, [40], WARM_FIRST_STEP_TOKENS, None) for a in ("ar", "d@N=3")]
    assert w.calls == 8 + 2 + 2 + 8 + 2 and w.summary()["calls"] == w.calls
    calls.clear()
    w.phase(2, [])  # nothing left to generate: no call
    w.chunk([], None)
    assert calls == []


def test_a_chunk_of_fewer_rows_in_a_warm_row_bucket_gets_its_prefill_shape():
    """The prompt class is the prefill's shape (`dflash2.engine.prefill.prefill_shape`): the last
    chunk of 3 rows, in the row bucket of the 4-row chunks (warm already), still gets its own
    prefill and first step, so no timed call captures its prefill graph."""
    calls, generate = _recorder()
    w = Warmup(generate, [_arm("ar")], max_new_tokens=64, n_stops=0, vocab=100, clock=lambda: 0.0)
    prompts = [[1] * 30] * 7
    w.phase(4, prompts)
    calls.clear()
    w.chunk(prompts[:4], None)
    assert calls == [("ar", [30] * 4, WARM_FIRST_STEP_TOKENS, None)]
    calls.clear()
    w.chunk(prompts[4:], None)
    assert calls == [("ar", [30] * 3, WARM_FIRST_STEP_TOKENS, None)]


def _run(out, monkeypatch, warm: bool):
    from tests.evaluation.test_eval_configs import _compose

    import dflash2.engine as engine
    from dflash2.evaluation.running import warmup
    from dflash2.evaluation.running.run import run_eval

    calls = []
    real = engine.speculative_generate

    def recording(target, draft, prompts, **kw):
        calls.append({"draft": draft is not None, "rows": len(prompts), "max_new_tokens": kw["max_new_tokens"],
                      "stops": kw.get("stop_token_ids"), "engine": {k: kw.get(k) for k in ("impl", "exact")}})
        return real(target, draft, prompts, **kw)

    monkeypatch.setattr(engine, "speculative_generate", recording)
    if not warm:
        monkeypatch.setattr(warmup.Warmup, "phase", lambda self, rows, prompts: None)
        monkeypatch.setattr(warmup.Warmup, "chunk", lambda self, prompts, stops: None)
    cfg = _compose(["experiment=tiny_cpu", "data.limit=1", "max_new_tokens=8", f"output_dir={out}",
                    "hardware.num_threads=1", "batch_size=2"])
    run_eval(cfg, out, job_name="eval")
    return calls, json.loads((out / "summary.json").read_text()), read_records(out / "records.jsonl")


def test_runner_warms_untimed_and_changes_no_record(tmp_path, monkeypatch):
    calls, summary, records = _run(tmp_path / "warm", monkeypatch, warm=True)
    e2e = summary["end_to_end"]
    warm_calls = e2e["warmup"]["calls"]
    assert warm_calls > 0 and e2e["warmup"]["seconds"] > 0
    # The first calls are the phase's warm-up at full length, AR and the drafter arm (the oracle reads
    # AR's tokens and is not warmed), with the run's engine settings and as many stop ids as the run
    # passes, all the vocabulary's last id.
    first, last = calls[:2], calls[-1]
    assert [c["draft"] for c in first] == [False, True] and all(c["max_new_tokens"] == 8 for c in first)
    assert all(c["engine"] == last["engine"] for c in first)
    assert all(len(c["stops"]) == len(last["stops"]) and len(set(c["stops"])) == 1 for c in first)
    assert first[0]["stops"] != last["stops"]
    # Each arm's timing counts only its own timed chunks, never a warm-up call.
    chunks = sum(e["chunks"] for e in e2e["per_arm"].values())
    assert len(calls) == chunks + warm_calls
    assert "untimed warm-up first" in (tmp_path / "warm" / "report.html").read_text()

    _, cold_summary, cold = _run(tmp_path / "cold", monkeypatch, warm=False)
    assert cold_summary["end_to_end"]["warmup"]["calls"] == 0
    key = lambda r: (r.arm, r.sample_id)  # noqa: E731
    assert [(key(r), r.tokens, r.accepted) for r in sorted(records, key=key)] == \
        [(key(r), r.tokens, r.accepted) for r in sorted(cold, key=key)]
