"""The loop reads each step's report asynchronously (dflash2.engine.reports), on CPU.

A stand-in for an asynchronous device: every step (eager or "replayed") and every report copy is
queued instead of run, and the queue runs only when the host waits for a report, up to that
report's copy. A host that read the device state per step (a `.tolist()` of the lengths or the
finished flags) would read stale buffers there and lose tokens; a host that waited for each step
right after launching it shows up as a blocking wait (nothing queued behind the report it waits
for). The pipelined loop must give the synchronous loop's (`timing=True`) tokens, acceptances and
finish reasons, greedy and sampled, eager and on the graph path, with rows stopping at different
steps; it may block only on a step expected to be the last one (every active row within reach of
its budget at the call's mean rate so far). An extra step on finished rows (the loop's one step of
lookahead) changes nothing.
"""

from __future__ import annotations

import pytest
import torch

from dflash2 import speculative_generate
from dflash2.engine import generate as engine_generate
from dflash2.engine import inputs as engine_inputs
from dflash2.engine import prefill as engine_prefill
from dflash2.engine import kept as engine_kept
from dflash2.engine import reports as engine_reports
from dflash2.engine import state as engine_state
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer
from tests.engine.helpers import fp32_target_draft_prompts
from tests.engine.test_graph_step import ReplayByRunning

VOCAB = 300
NEW = 24


class DeferredDevice:
    """Queues the steps and report copies; `wait(k)` runs the queue through the copy of step k."""

    def __init__(self):
        self.queue: list[tuple[int | None, object]] = []  # (posted step or None, work)
        self.last_posted = 0
        self.waits: list[tuple[int, bool]] = []  # (step, blocking: nothing was queued behind it)

    def install(self, monkeypatch):
        real_step, real_post, real_wait = (engine_state.DecodeState.step, engine_reports.StepReports.post,
                                           engine_reports.StepReports.wait)
        device = self

        def step(state, kv_len, record=None, clock=None):
            device.queue.append((None, lambda: real_step(state, kv_len, record, clock)))
            return 0.0

        def post(reports, k):
            device.queue.append((k, lambda: real_post(reports, k)))
            device.last_posted = k

        def wait(reports, k):
            device.waits.append((k, device.last_posted == k))
            while device.queue:
                posted, work = device.queue.pop(0)
                work()
                if posted == k:
                    break
            return real_wait(reports, k)

        monkeypatch.setattr(engine_state.DecodeState, "step", step)
        monkeypatch.setattr(engine_reports.StepReports, "post", post)
        monkeypatch.setattr(engine_reports.StepReports, "wait", wait)


@pytest.fixture(scope="module")
def models():
    return fp32_target_draft_prompts(VOCAB, layers=3)


def _force_graph_path(monkeypatch):
    monkeypatch.setattr(engine_inputs, "_graphs_arg", lambda graphs, tgt, draft, exact: bool(graphs))
    monkeypatch.setattr(engine_generate, "StepGraphs", ReplayByRunning)
    monkeypatch.setattr(engine_prefill, "StepGraphs", ReplayByRunning)
    monkeypatch.setattr(engine_generate, "GRAPH_KV_BUCKET", 8)


def _drafter(kind, draft, prompts, ar):
    if kind == "ar":
        return None
    if kind == "dflash2":
        return draft
    refs = [p.tolist() + g.tolist() for p, g in zip(prompts, ar.generated)]
    return DeviceOracleProposer(refs, [1, 2, 3], block_size=8, accept_prob=0.8, vocab_size=VOCAB, device="cpu")


_AR: dict = {}


def _ar(target, prompts, temperature):
    if temperature not in _AR:
        _AR[temperature] = speculative_generate(target, None, prompts, max_new_tokens=NEW, temperature=temperature,
                                                seed=[1, 2, 3])
    return _AR[temperature]


# Each proposer greedy and sampled, each on one of the two paths (eager loop / graph path).
@pytest.mark.parametrize("kind, temperature, graphs", [
    ("ar", 0.0, False), ("ar", 1.0, True), ("dflash2", 0.0, True), ("dflash2", 1.0, False),
    ("oracle", 0.0, False), ("oracle", 1.0, True)])
def test_pipelined_loop_equals_the_synchronous_loop_on_a_deferred_device(models, monkeypatch, kind, temperature,
                                                                         graphs):
    target, draft, prompts = models
    ar = _ar(target, prompts, temperature)
    stop = int(ar.generated[0][6])  # row 0 stops early, the others run to the budget or their own stop
    drafter = _drafter(kind, draft, prompts, ar)
    n = 5 if drafter is not None else 0
    kw = dict(max_new_tokens=NEW, num_speculative_tokens=n or None, temperature=temperature, seed=[1, 2, 3],
              stop_token_ids=[stop])
    reference = speculative_generate(target, drafter, prompts, timing=True, **kw)  # waits after every step
    if graphs:
        _force_graph_path(monkeypatch)
    device = DeferredDevice()
    device.install(monkeypatch)
    out = speculative_generate(target, drafter, prompts, graphs=graphs, **kw)
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in reference.sequences]
    assert out.accepted == reference.accepted and out.finish_reasons == reference.finish_reasons
    assert len(set(map(len, reference.accepted))) > 1  # rows end at different steps
    steps = [k for k, _ in device.waits]
    assert device.queue == []  # every launched step was waited for
    assert steps == list(range(1, len(steps) + 1)) and len(out.times.verify) == len(steps)
    assert len(steps) <= max(map(len, reference.accepted)) + 1  # at most one lookahead step
    # The graph path times each runner call (the host's launch of a replay) once per step it ran.
    assert len(out.times.launch) == (len(steps) if graphs else 0) and all(x >= 0 for x in out.times.launch)
    blocking = [k for k, b in device.waits if b]
    if kind == "ar" and temperature == 0.0:
        # AR commits one token a step: only the last step can end the call, and no step runs after it.
        assert blocking == [len(steps)] and len(steps) == max(map(len, reference.accepted))
    else:
        # Blocking waits only at the tail, where the last rows are expected to reach their budget
        # (a host that read every step's report right away would block at every step).
        assert len(steps) >= 6 and len(blocking) <= 2 and all(k >= len(steps) - 2 for k in blocking)


def test_a_step_on_finished_rows_changes_nothing(models, monkeypatch):
    """The lookahead step: after a call, one more step on the kept state leaves every output intact."""
    target, draft, prompts = models
    _force_graph_path(monkeypatch)
    engine_kept.release_decode_state(target)
    out = speculative_generate(target, draft, prompts, max_new_tokens=12, num_speculative_tokens=5, graphs=True,
                               temperature=1.0, seed=[4, 5, 6])
    state = engine_kept.kept_states(target).latest()
    before = {name: getattr(state, name).clone() for name in ("tokens", "gen", "done", "hit_stop", "budget")}
    lengths = state.cache.lengths.clone()
    state.step(state.max_len)
    for name, value in before.items():
        if name == "tokens":  # everything but the trash column, which absorbs the masked writes
            assert torch.equal(getattr(state, name)[:, :state.trash], value[:, :state.trash])
        else:
            assert torch.equal(getattr(state, name), value), name
    assert torch.equal(state.cache.lengths, state.plens + state.gen - 1)  # the rows' anchors: nothing committed
    assert (lengths >= state.cache.lengths).all()
    report = state.report
    assert report[engine_reports.NEW].eq(0).all() and report[engine_reports.ACTIVE].eq(0).all()
    assert [s.tolist() for s in out.sequences] == [state.tokens[b, : out.prompt_lengths[b] + len(g)].tolist()
                                                    for b, g in enumerate(out.generated)]
    engine_kept.release_decode_state(target)


def test_the_collector_is_off_during_the_loop_and_restored_after(models, monkeypatch):
    """No garbage collection can stall the host between steps: the collector is off at every report
    read of the loop, back on after the call (and after a failing one), and left off if it was."""
    import gc

    target, draft, prompts = models
    real_wait = engine_reports.StepReports.wait
    seen: list[bool] = []

    def wait(reports, k):
        seen.append(gc.isenabled())
        return real_wait(reports, k)

    monkeypatch.setattr(engine_reports.StepReports, "wait", wait)
    assert gc.isenabled()
    speculative_generate(target, draft, prompts, max_new_tokens=6, num_speculative_tokens=3)
    assert seen and not any(seen) and gc.isenabled()

    def failing_wait(reports, k):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine_reports.StepReports, "wait", failing_wait)
    with pytest.raises(RuntimeError, match="device lost"):
        speculative_generate(target, draft, prompts, max_new_tokens=6, num_speculative_tokens=3)
    assert gc.isenabled()
    gc.disable()
    try:
        with engine_generate.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
