"""The graph-replayed step's bookkeeping, on CPU (the CUDA graphs themselves: tests/gpu/test_graphs.py).

A captured step must depend on nothing but the static state it reads and writes in place. Here a
stand-in for `StepGraphs` runs the very same step body at every "replay" (and skips the capture),
through the loop's graph path: K/V buckets of its own, the prompt's context taken by the proposer
after the prefill (so step 1 replays as well), the report as the only host read. The outputs must equal the eager
loop's token for token, greedy and sampled, with rows stopping at different steps. Also: the
`graphs` argument's checks, and the device oracle (`DeviceOracleProposer`) the graph tests use.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from dflash2 import speculative_generate
from dflash2.engine import generate as engine_generate
from dflash2.engine import inputs as engine_inputs
from dflash2.engine import prefill as engine_prefill
from dflash2.engine.inputs import GenerateInputError
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer, OracleProposer
from tests.engine.helpers import fp32_target_draft_prompts

VOCAB = 300


class ReplayByRunning:
    """CPU stand-in for `StepGraphs`: a 'capture' per key (not run), then each 'replay' runs the
    body for that key (the decoding step's K/V bucket, or the prefill's shape)."""

    instances: list[ReplayByRunning] = []

    def __init__(self, body, device, what="the decoding step"):
        self.body, self.what, self.buckets, self.replays, self.captures, self.failed = body, what, set(), 0, 0, None
        ReplayByRunning.instances.append(self)

    def step(self, kv_len: int) -> bool:
        return self.run(kv_len)[0]

    def run(self, key):
        out = self.body(key)  # the warm-up run (real, then a capture that runs nothing), or a "replay"
        if key not in self.buckets:
            self.buckets.add(key)
            self.captures += 1
            return False, out
        self.replays += 1
        return True, out


@pytest.fixture(scope="module")
def models():
    return fp32_target_draft_prompts(VOCAB, layers=4)


@pytest.fixture
def fake_graphs(monkeypatch):
    """Force the graph path on CPU with the stand-in, and buckets of 8 K/V slots (so a run crosses several)."""
    monkeypatch.setattr(engine_inputs, "_graphs_arg", lambda graphs, tgt, draft, exact: bool(graphs))
    monkeypatch.setattr(engine_generate, "StepGraphs", ReplayByRunning)
    monkeypatch.setattr(engine_prefill, "StepGraphs", ReplayByRunning)
    monkeypatch.setattr(engine_generate, "GRAPH_KV_BUCKET", 8)
    ReplayByRunning.instances.clear()
    return ReplayByRunning.instances


def _same(a, b):
    assert [s.tolist() for s in a.sequences] == [s.tolist() for s in b.sequences]
    assert a.accepted == b.accepted and a.finish_reasons == b.finish_reasons


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("proposer", ["ar", "dflash2", "oracle"])
def test_graph_path_bookkeeping_equals_the_eager_loop(models, fake_graphs, temperature, proposer):
    target, draft, prompts = models
    ar = speculative_generate(target, None, prompts, max_new_tokens=30, temperature=temperature, seed=[1, 2, 3],
                              graphs=False)
    # A stop token that row 0 emits early, so rows finish at different steps.
    stop = int(ar.generated[0][6])
    if proposer == "oracle":
        refs = [p.tolist() + g.tolist() for p, g in zip(prompts, ar.generated)]
        drafter = DeviceOracleProposer(refs, [1, 2, 3], block_size=8, accept_prob=0.8, vocab_size=VOCAB, device="cpu")
    else:
        drafter = draft if proposer == "dflash2" else None
    kw = dict(max_new_tokens=30, num_speculative_tokens=5 if drafter is not None else None, temperature=temperature,
              seed=[1, 2, 3], stop_token_ids=[stop])
    eager = speculative_generate(target, drafter, prompts, graphs=False, **kw)
    graphed = speculative_generate(target, drafter, prompts, graphs=True, **kw)
    _same(graphed, eager)
    assert len(set(map(len, eager.accepted))) > 1  # rows end at different steps
    if temperature == 0.0 or drafter is None:  # the same path as the reference AR run: row 0 stops early
        assert eager.finish_reasons[0] == "stop"
    runner = fake_graphs[-1]
    assert runner.captures >= 2 and runner.replays > 0  # K/V buckets crossed, most steps replayed
    assert graphed.times.graph_replays == runner.replays and graphed.times.graph_captures == runner.captures
    # Every step goes through the runner, the first included (the prompt's features, if any, went
    # to the proposer in `start`): one warm-up per bucket, replays otherwise.
    assert len(graphed.times.verify) == runner.captures + runner.replays
    assert graphed.times.replayed.count(True) == runner.replays
    assert len(graphed.times.replayed) == len(graphed.times.verify)
    assert not graphed.times.replayed[0] and eager.times.replayed == []
    # A kept state (the device oracle's too, keyed by the proposer object): the next call with the
    # same drafter replays from its first step on, with the same tokens.
    again = speculative_generate(target, drafter, prompts, graphs=True, **kw)
    _same(again, eager)
    assert again.times.replayed[0] and again.times.graph_captures == 0
    if proposer == "oracle" and temperature == 0.0:
        assert sum(map(sum, eager.accepted)) / sum(map(len, eager.accepted)) >= 1.0  # the path really accepts


def test_prefill_graphs_are_kept_per_shape_and_replayed_for_new_prompts(models, fake_graphs, monkeypatch):
    """The graph path's prefill: a call captures the prefill of its `PrefillShape`; a later call
    whose prompts differ but pad to the same bucket replays it (with its own prompts' tokens, the
    eager loop's output); a longer prompt is a new shape, captured in turn. The evaluation's
    timing counts the prefill's captures and replays."""
    from dflash2.evaluation.running.timing import ArmTiming

    monkeypatch.setattr(engine_generate, "CPU_PREFILL_BUCKET", 16)
    target, draft, prompts = models
    short = [p[:9] for p in prompts]                       # 9 tokens: pads to 16
    other = [p[:13].flip(0) for p in prompts]             # other tokens, 13: the same bucket
    longer = [torch.cat([p, p])[:20] for p in prompts]     # 20: the next bucket
    kw = dict(max_new_tokens=12, num_speculative_tokens=3, seed=[1, 2, 3])
    timing = ArmTiming()
    seen = []
    for rows in (short, other, longer, other):
        graphed = speculative_generate(target, draft, rows, graphs=True, **kw)
        _same(graphed, speculative_generate(target, draft, rows, graphs=False, **kw))
        seen.append(graphed.times.prefill_graph)
        timing.add_call(1.0, graphed.times)
    assert seen == ["capture", "replay", "capture", "replay"]
    prefill_runner = next(r for r in fake_graphs if r.what == "the prefill")
    assert prefill_runner.captures == 2 and prefill_runner.replays == 2
    assert timing.prefill_replays == 2
    assert timing.graph_captures >= 2                       # the prefill's two captures at least
    eager = speculative_generate(target, draft, short, graphs=False, **kw)
    assert eager.times.prefill_graph == "eager"


class _NoHostReads(torch.overrides.TorchFunctionMode):
    """Fails on any tensor-to-host read (what a CUDA graph capture refuses)."""

    HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
                  torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
                  torch.unique, torch.Tensor.unique, torch.Tensor.cpu, torch.Tensor.numpy}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.HOST_READS:
            raise AssertionError(f"the prefill body reads a tensor on the host: {func}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("invariant", [False, True])
def test_prefill_body_makes_no_host_read(models, monkeypatch, invariant):
    """`prefill_forward`, what the graph path captures, reads no tensor on the host, in normal and
    invariant exact mode, with features returned (a drafter's layers) and in row groups; its
    outputs have the shapes its `PrefillShape` promises. (That a replay serves other prompts of the
    same shape: tests/gpu/test_prefill_graphs.py.)"""
    monkeypatch.setattr(engine_generate, "CPU_PREFILL_BUCKET", 16)
    monkeypatch.setattr(engine_prefill, "PREFILL_ROWS", 2)  # three prompts: two row groups
    target, _, prompts = models
    shapes = []
    real = engine_prefill.prefill_forward

    def guarded(state, shape):
        with _NoHostReads():
            first, feats = real(state, shape)
        shapes.append((shape, first.shape, None if feats is None else feats.shape))
        return first, feats

    monkeypatch.setattr(engine_prefill, "prefill_forward", guarded)
    oracle = OracleProposer([p.tolist() for p in prompts], [0, 0, 0], block_size=8, accept_prob=0.0,
                            vocab_size=VOCAB)
    oracle.target_layer_ids = [0, 1]  # the prefill then returns features
    kw = {"exact": True, "exact_impl": "invariant", "exact_block_size": 8} if invariant else {}
    rows = [p[:9] for p in prompts]
    out = speculative_generate(target, oracle, rows, max_new_tokens=12, num_speculative_tokens=3, **kw)
    ar = speculative_generate(target, None, rows, max_new_tokens=12, **kw)
    assert [g.tolist() for g in out.generated] == [g.tolist() for g in ar.generated]
    (shape, first_shape, feats_shape), (_, _, no_feats) = shapes  # the drafter's call, then AR's
    assert no_feats is None
    assert shape.invariant == invariant and len(shape.groups) == 2 and shape.length == 16
    assert first_shape == (3, 1, VOCAB) and feats_shape[:2] == (3, 16)


def test_graphs_argument_is_checked(models):
    target, draft, prompts = models
    with pytest.raises(GenerateInputError, match="graphs: is True but the target is on cpu"):
        speculative_generate(target, draft, prompts, max_new_tokens=4, graphs=True)
    with pytest.raises(GenerateInputError, match="graphs: is 'yes'"):
        speculative_generate(target, draft, prompts, max_new_tokens=4, graphs="yes")
    host = OracleProposer([prompts[0].tolist()], [0], block_size=8, accept_prob=0.5, vocab_size=VOCAB)
    with pytest.raises(GenerateInputError, match="does not declare graph_safe"):
        engine_inputs._graphs_arg(True, type("T", (), {"device": torch.device("cuda")})(), host, False)
    with pytest.raises(GenerateInputError, match="exact mode"):
        engine_inputs._graphs_arg(True, type("T", (), {"device": torch.device("cuda")})(), None, True)
    # Auto: off on CPU, on for a CUDA target with a capturable proposer, off for a host proposer.
    cuda_target = type("T", (), {"device": torch.device("cuda")})()
    assert engine_inputs._graphs_arg(None, engine_inputs.as_target(target), draft, False) is False
    assert engine_inputs._graphs_arg(None, cuda_target, draft, False) is True
    assert engine_inputs._graphs_arg(None, cuda_target, host, False) is False
    assert engine_inputs._graphs_arg(False, cuda_target, draft, False) is False


@pytest.mark.parametrize("p", [0.0, 0.6, 1.0])
def test_device_oracle_follows_the_oracle_law_and_stays_lossless(models, p):
    target, _, prompts = models
    ar = speculative_generate(target, None, prompts, max_new_tokens=24)
    refs = [q.tolist() + g.tolist() for q, g in zip(prompts, ar.generated)]
    oracle = DeviceOracleProposer(refs, [5, 6, 2**64 - 1], block_size=8, accept_prob=p, vocab_size=VOCAB,
                                  device="cpu")
    out = speculative_generate(target, oracle, prompts, max_new_tokens=24, num_speculative_tokens=7)
    assert [g.tolist() for g in out.generated] == [g.tolist() for g in ar.generated]  # greedy: never changes output
    steps = [a for row in out.accepted for a in row[:-1]]  # the last step may be cut by the budget
    if p == 1.0:
        assert all(a == 7 for a in steps)
    elif p == 0.0:
        assert sum(steps) == 0
    else:
        # E[accepted] = sum_j p^j over 7 slots = 1.35 at p = 0.6; generous bounds over ~20 steps
        assert 0.6 < sum(steps) / len(steps) < 2.4
    with pytest.raises(ValueError, match="accept_prob"):
        DeviceOracleProposer(refs, [0, 0, 0], block_size=8, accept_prob=1.5, vocab_size=VOCAB, device="cpu")


def test_a_failed_capture_warns_and_finishes_eagerly(monkeypatch):
    """A step that cannot be captured must not crash the call or repeat a step: the capture runs
    nothing, so after the warning every later step runs the body eagerly, once."""
    from dflash2.engine import graphs as graphs_mod

    class NoGraph:
        def pool(self):
            return None

    @contextlib.contextmanager
    def refuse(graph, pool=None):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield  # pragma: no cover

    monkeypatch.setattr(torch.cuda, "CUDAGraph", NoGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "graph", refuse)
    calls = []
    runner = graphs_mod.StepGraphs(calls.append, torch.device("cuda"))
    with pytest.warns(RuntimeWarning, match="capture of the decoding step failed.*runs eagerly"):
        assert runner.step(256) is False
    assert [runner.step(256), runner.step(512), runner.step(512)] == [False] * 3
    assert calls == [256, 256, 512, 512] and runner.replays == runner.captures == 0
    assert runner.eager_steps == 4 and "not permitted" in runner.failed
    with pytest.raises(ValueError, match="CUDA device"):
        graphs_mod.StepGraphs(calls.append, torch.device("cpu"))
