"""Batch buckets and the decoding state kept across calls (dflash2.engine.state), on CPU.

The graph path is forced on CPU with the stand-in runner of test_graph_step.py (each "replay" runs
the step body on the static state), so what is checked here is everything but the CUDA graph
itself: a call of B rows runs in a state of `batch_bucket(B)` rows whose extra rows stay idle, and a
later call with the same key loads its prompts into the same buffers and "replays" the buckets an
earlier call captured; the tokens must equal the eager loop's every time. The GPU side (graphs
captured by one call replayed by the next): tests/gpu/test_graphs.py.
"""

from __future__ import annotations

import pytest
import torch

from dflash2 import DFlash2DraftModel, speculative_generate
from dflash2.engine import generate as engine_generate
from dflash2.engine import inputs as engine_inputs
from dflash2.engine import prefill as engine_prefill
from dflash2.engine import kept as engine_kept
from dflash2.engine.cache import StaticTargetCache
from dflash2.engine.kept import release_decode_state
from dflash2.engine.state import batch_bucket
from tests.conftest import randomize_, tiny_draft_config, tiny_qwen3
from tests.engine.test_graph_step import ReplayByRunning

VOCAB = 300


@pytest.fixture
def models():
    target = tiny_qwen3(vocab=VOCAB, hidden=64, layers=4, seed=0).float()
    draft = randomize_(DFlash2DraftModel(tiny_draft_config(vocab=VOCAB, block_size=8)), seed=1, std=0.05).eval()
    return target, draft


@pytest.fixture
def fake_graphs(monkeypatch):
    monkeypatch.setattr(engine_inputs, "_graphs_arg", lambda graphs, tgt, draft, exact: bool(graphs))
    monkeypatch.setattr(engine_generate, "StepGraphs", ReplayByRunning)
    monkeypatch.setattr(engine_prefill, "StepGraphs", ReplayByRunning)
    monkeypatch.setattr(engine_generate, "GRAPH_KV_BUCKET", 8)
    monkeypatch.setattr(engine_generate, "LEN_BUCKET", 64)


def _prompts(seed: int, lengths) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (n,), generator=g) for n in lengths]


def _kept(target):
    """The most recently used state kept on the target (None if none)."""
    held = engine_kept.kept_states(target)
    return None if held is None else held.latest()


def _check(target, drafter, prompts, **kw):
    """Graph path (kept state) vs eager loop: the same tokens, acceptances and finish reasons."""
    eager = speculative_generate(target, drafter, prompts, graphs=False, **kw)
    graphed = speculative_generate(target, drafter, prompts, graphs=True, **kw)
    assert [s.tolist() for s in graphed.sequences] == [s.tolist() for s in eager.sequences]
    assert graphed.accepted == eager.accepted and graphed.finish_reasons == eager.finish_reasons
    return graphed


def test_batch_buckets():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 32, 32, 64, 64, 96]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_state_is_reused_across_calls_and_stays_lossless(models, fake_graphs, temperature):
    target, draft = models
    kw = dict(num_speculative_tokens=5, temperature=temperature)
    # Call 1: 3 rows in a bucket of 4 (one idle row), a stop token, rows ending at different steps.
    first = _prompts(0, (5, 19, 11))
    ar = speculative_generate(target, None, first, max_new_tokens=30, graphs=False)
    out1 = _check(target, draft, first, max_new_tokens=30, seed=[1, 2, 3], stop_token_ids=[int(ar.generated[0][6])],
                  **kw)
    state = _kept(target)
    assert state is not None and state.batch == 4 and out1.times.graph_captures >= 2
    buckets = set(state.runner.buckets)
    # Call 2: other prompts (4 rows, no idle row), another budget and another stop token of the same
    # count: the same state, and the K/V buckets call 1 captured are replayed, not captured again.
    second = _prompts(1, (7, 3, 16, 9))
    out2 = _check(target, draft, second, max_new_tokens=24, seed=[9, 8, 7, 6], stop_token_ids=[int(ar.generated[1][3])],
                  **kw)
    assert _kept(target) is state
    assert out2.times.graph_captures == len(set(state.runner.buckets) - buckets)
    assert out2.times.graph_replays > 0
    # Call 3: a new batch bucket (2 rows) replaces the kept state.
    out3 = _check(target, draft, _prompts(2, (4, 12)), max_new_tokens=12, seed=[4, 5],
                  stop_token_ids=[int(ar.generated[2][2])], **kw)
    assert _kept(target) is not state and _kept(target).batch == 2 and out3.times.graph_captures >= 1


def test_a_longer_call_gets_a_larger_state(models, fake_graphs):
    target, draft = models
    _check(target, draft, _prompts(3, (5, 6)), max_new_tokens=10, num_speculative_tokens=3)
    small = _kept(target)
    _check(target, draft, _prompts(4, (50, 6)), max_new_tokens=40, num_speculative_tokens=3)
    big = _kept(target)
    assert big is not small and big.max_len > small.max_len and big.max_len % 64 == 0
    _check(target, draft, _prompts(5, (5, 6)), max_new_tokens=10, num_speculative_tokens=3)
    assert _kept(target) is big  # a shorter call fits the larger state


def test_what_changes_the_graphs_changes_the_key(models, fake_graphs):
    target, draft = models
    prompts = _prompts(6, (5, 9))
    runs = [dict(num_speculative_tokens=3), dict(num_speculative_tokens=3), dict(num_speculative_tokens=4),
            dict(num_speculative_tokens=4, temperature=1.0, top_k=20), dict(num_speculative_tokens=4, temperature=1.0,
                                                                         top_k=30)]
    states = []
    for kw in runs:
        _check(target, draft, prompts, max_new_tokens=8, seed=[1, 2], **kw)
        states.append(_kept(target))
    assert states[0] is states[1]
    assert len({id(s) for s in states[1:]}) == 4
    # AR and the draft do not share a state; neither do weights replaced (not updated in place).
    _check(target, None, prompts, max_new_tokens=8)
    ar_state = _kept(target)
    assert ar_state is not states[-1]
    with torch.no_grad():
        target.lm_head.weight = torch.nn.Parameter(target.lm_head.weight.detach().clone())
    _check(target, None, prompts, max_new_tokens=8)
    assert _kept(target) is not ar_state
    # In-place updates keep the key (a graph reads weights by address, so it sees them).
    kept = _kept(target)
    with torch.no_grad():
        target.lm_head.weight.mul_(1.5)
    _check(target, None, prompts, max_new_tokens=8)
    assert _kept(target) is kept


def test_release_and_a_state_in_use(models, fake_graphs):
    target, draft = models
    prompts = _prompts(7, (5, 9, 4))
    _check(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=3)
    held = _kept(target)
    # A state in use (its lock held, as by another thread) is never shared: the call builds its own.
    held.lock.acquire()
    try:
        _check(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=3)
        assert _kept(target) is not held
    finally:
        held.lock.release()
    import gc
    import weakref

    ReplayByRunning.instances.clear()  # the stand-in's own registry would keep the runners alive
    gc.collect()
    gc.disable()  # freed by reference counting alone (the step's graphs and buffers go at once)
    try:
        ref = weakref.ref(_kept(target))
        assert release_decode_state(target) is True and _kept(target) is None
        assert ref() is None
    finally:
        gc.enable()
    assert release_decode_state(target) is False


def test_interleaved_arms_each_replay_their_own_kept_state(models, fake_graphs):
    """An evaluation's loop: AR, N = 3 and N = 5 interleaved per prompt. From the second round on
    every call finds its own state and captures nothing, and the tokens stay the eager loop's."""
    target, draft = models
    release_decode_state(target)
    arms = [(None, {}), (draft, dict(num_speculative_tokens=3)), (draft, dict(num_speculative_tokens=5))]
    states = {}
    for round_ in range(3):
        prompts = _prompts(20 + round_, (6, 9))
        for i, (drafter, kw) in enumerate(arms):
            out = _check(target, drafter, prompts, max_new_tokens=12, **kw)
            if round_ == 0:
                assert out.times.graph_captures >= 1
                states[i] = _kept(target)
            else:
                assert _kept(target) is states[i] and out.times.graph_captures == 0
    assert len(engine_kept.kept_states(target).states) == 3


def test_kept_states_are_capped_least_recently_used_first(models, fake_graphs, monkeypatch):
    target, draft = models
    release_decode_state(target)
    monkeypatch.setattr(engine_kept, "MAX_KEPT_STATES", 2)
    prompts = _prompts(30, (5, 7))
    built = []
    for n in (2, 3, 2, 4):  # N = 2 is used again before N = 4 arrives, so N = 3 is the one freed
        _check(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=n)
        built.append(_kept(target))
    kept = engine_kept.kept_states(target)
    assert built[2] is built[0] and list(kept.states.values()) == [built[0], built[3]]
    assert built[1].runner is None  # closed: its graphs are gone
    # A state in use is never freed, even past the cap; the next keep frees it once it is free.
    built[0].lock.acquire()
    try:
        _check(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=5)
        assert built[0] in kept.states.values() and built[3] not in kept.states.values()
    finally:
        built[0].lock.release()
    # By bytes: a cap below two states' buffers keeps only the newest.
    one = engine_kept.state_nbytes(_kept(target))
    assert one > 0
    monkeypatch.setattr(engine_kept, "kept_bytes_cap", lambda device: one + one // 2)
    _check(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=6)
    assert list(kept.states.values()) == [_kept(target)]
    assert release_decode_state(target) is True and engine_kept.kept_states(target) is None


def test_state_bytes_count_the_buffers_not_the_weights(models, fake_graphs):
    target, draft = models
    release_decode_state(target)
    _check(target, draft, _prompts(31, (5, 7)), max_new_tokens=8, num_speculative_tokens=3)
    state = _kept(target)
    weights = sum(p.numel() * p.element_size() for p in (*target.parameters(), *draft.parameters()))
    kv = sum(t.untyped_storage().nbytes() for layer in state.cache.layers for t in (layer.keys, layer.values))
    own = engine_kept.state_nbytes(state)
    assert kv <= own < kv + weights
    # References to the models' weights held by the state (as the linear mode's fused groups hold
    # them), views included, are not the state's memory; a buffer of its own is.
    state.held_weights = {"groups": [(target.lm_head.weight, target.lm_head.weight.t()),
                                     tuple(draft.parameters())]}
    assert engine_kept.state_nbytes(state) == own
    state.held_weights["own"] = [torch.zeros(1000)]
    assert engine_kept.state_nbytes(state) == own + 4000


def test_eager_loop_and_custom_proposers_keep_no_state(models):
    target, draft = models
    release_decode_state(target)
    speculative_generate(target, draft, _prompts(8, (5, 9, 4)), max_new_tokens=6)
    assert _kept(target) is None


def test_cache_prepare_rows_checks():
    from tests.conftest import tiny_qwen3 as tq

    cfg = tq(vocab=VOCAB, hidden=64, layers=2, seed=0).config
    cache = StaticTargetCache(cfg, 4, 16, torch.float32, "cpu")
    pos = torch.arange(3)[None].expand(2, 3)
    cache.prepare(pos, rows=2)
    assert cache.state.span == (0, 2)
    cache.prepare(pos, rows=2, start=2)
    assert cache.state.span == (2, 4)
    cache.prepare(pos[:1], row=3)
    assert cache.state.span == (3, 4)
    cache.prepare(pos)
    assert cache.state.span is None
    with pytest.raises(ValueError, match="rows=5"):
        cache.prepare(pos, rows=5)
    with pytest.raises(ValueError, match="rows=2 from row 3"):
        cache.prepare(pos, rows=2, start=3)
    with pytest.raises(ValueError, match="start needs rows"):
        cache.prepare(pos, start=1)
    with pytest.raises(ValueError, match="not combined with row"):
        cache.prepare(pos[:1], row=1, rows=2)


def test_a_row_span_writes_only_its_rows():
    """A forward prepared for rows 2..3 scatters its K/V into those rows' buffers alone."""
    from tests.conftest import tiny_qwen3 as tq

    cfg = tq(vocab=VOCAB, hidden=64, layers=2, seed=0).config
    cache = StaticTargetCache(cfg, 4, 16, torch.float32, "cpu")
    layer = cache.layers[0]
    nkv, hd = cache.heads[1], cache.heads[2]
    layer.lazy_initialization(torch.zeros(4, nkv, 1, hd), torch.zeros(4, nkv, 1, hd))
    cache.prepare(torch.arange(3)[None].expand(2, 3), kv_len=3, rows=2, start=2)
    k, v = torch.randn(2, nkv, 3, hd), torch.randn(2, nkv, 3, hd)
    keys, values = layer.update(k, v)
    assert torch.equal(keys, k) and torch.equal(values, v)
    assert torch.equal(layer.keys[2:, :, :3], k) and not layer.keys[:2].any() and not layer.values[:2].any()


def test_a_state_that_does_not_fit_frees_the_idle_kept_ones_and_retries_once(models, fake_graphs, monkeypatch):
    target, draft = models
    release_decode_state(target)
    prompts = _prompts(40, (5, 7))
    _check(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=3)
    old = _kept(target)
    eager = speculative_generate(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=4, graphs=False)
    real, calls = engine_generate.DecodeState, []

    def short_of_memory_once(*args, **kw):
        held = engine_kept.kept_states(target)
        calls.append(0 if held is None else len(held.states))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (as if)")
        return real(*args, **kw)

    monkeypatch.setattr(engine_generate, "DecodeState", short_of_memory_once)
    out = speculative_generate(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=4, graphs=True)
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in eager.sequences]
    assert calls == [1, 0] and old.runner is None  # the idle state was freed before the second try
    assert list(engine_kept.kept_states(target).states.values()) == [_kept(target)] and _kept(target) is not old
    # With nothing to free the error is the caller's.
    calls.clear()
    release_decode_state(target)
    with pytest.raises(torch.OutOfMemoryError):
        speculative_generate(target, draft, prompts, max_new_tokens=8, num_speculative_tokens=5, graphs=True)
