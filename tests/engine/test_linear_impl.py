"""The engine with the small-M linear kernel (`linear_impl="triton"`; the Triton interpreter on
CPU) gives the reference's tokens: greedy AR and speculative on the eager loop and on the graph
path (the stand-in runner), with the function mode owned by the decoding state; under
`compile_level` through the opaque `dflash2::small_m_linear` operator; refusals where the mode
cannot run."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.engine.inputs import GenerateInputError
from dflash2.target import TargetModel
from tests.engine.helpers import qwen3_target, random_draft
from tests.engine.test_graph_step import fake_graphs  # noqa: F401 (fixture)

V = 300
PROMPTS = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([7, 8, 9, 10, 11, 12, 13, 14, 15])]


@pytest.fixture
def triton_cpu():
    pytest.importorskip("triton")
    from dflash2.kernels.dispatch import triton_interpreter_enabled

    if not triton_interpreter_enabled():  # the models here are on the CPU
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")


def _models():
    target = TargetModel(qwen3_target.__wrapped__(vocab=V).float())
    return target, random_draft.__wrapped__(vocab=V).float()


def test_small_m_linear_gives_the_reference_tokens(triton_cpu, monkeypatch):
    import dflash2.kernels.linear as linear

    target, draft = _models()
    routed = []
    real = linear.small_m_linear
    monkeypatch.setattr(linear, "small_m_linear", lambda *a, **k: routed.append(a[1].shape) or real(*a, **k))
    for drafter, n in [(None, None), (draft, 3)]:
        kw = dict(max_new_tokens=8, num_speculative_tokens=n, seed=0)
        ref = speculative_generate(target, drafter, PROMPTS, **kw)
        routed.clear()
        out = speculative_generate(target, drafter, PROMPTS, linear_impl="triton", **kw)
        assert routed, "no linear went through the small-M kernel"
        for a, b in zip(ref.sequences, out.sequences):
            assert torch.equal(a, b)
        assert out.accepted == ref.accepted
    # The reference path never enters the mode.
    routed.clear()
    speculative_generate(target, None, PROMPTS, max_new_tokens=4)
    assert routed == []


def test_the_state_owns_the_mode_and_the_refusals_name_the_conflict(triton_cpu):
    from dflash2.engine.settings import EngineSettings
    from dflash2.engine.state import DecodeState
    from dflash2.kernels.linear import SmallMLinearMode

    target, _ = _models()
    common = dict(batch=1, max_len=16, n_spec=0, width=1, sampled=False, top_k=0, top_p=1.0, n_stops=None,
                  layer_ids=[])
    on = DecodeState(target, None, engine=EngineSettings("torch", "torch", linear_impl="triton"), **common)
    off = DecodeState(target, None, engine=EngineSettings("torch", "torch"), **common)
    assert isinstance(on.linear_mode, SmallMLinearMode) and on.linear_mode.impl == "triton"
    assert off.linear_mode is None
    with pytest.raises(GenerateInputError, match="linear_impl: is 'triton' with exact=True"):
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, linear_impl="triton", exact=True,
                             exact_block_size=4)
    with pytest.raises(GenerateInputError, match="linear_impl: is 'fast'"):
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, linear_impl="fast")


def test_the_graph_path_replays_under_the_states_mode(triton_cpu, fake_graphs):  # noqa: F811
    """On the graph path (the CPU stand-in runner) the step runs under the mode the state owns,
    and the kept state's second call reuses that mode and gives the same tokens."""
    target, draft = _models()
    kw = dict(max_new_tokens=8, num_speculative_tokens=3, seed=0)
    ref = speculative_generate(target, draft, PROMPTS, graphs=False, **kw)
    first = speculative_generate(target, draft, PROMPTS, graphs=True, linear_impl="triton", **kw)
    again = speculative_generate(target, draft, PROMPTS, graphs=True, linear_impl="triton", **kw)
    assert fake_graphs and all(r.replays > 0 for r in fake_graphs)
    for out in (first, again):
        assert [s.tolist() for s in out.sequences] == [s.tolist() for s in ref.sequences]


def test_compiled_modules_call_the_kernel_as_one_operator(triton_cpu):
    """`compile_level="full"` with `linear_impl="triton"`: dynamo traces the mode's routing and
    emits `dflash2::small_m_linear` in the compiled graphs (no graph break but the attention
    call's), and the tokens equal the stock eager run's and the compiled run's without the kernel."""
    from dflash2.engine.compiled import compile_modules

    target, draft = _models()
    kw = dict(max_new_tokens=8, num_speculative_tokens=3, seed=0)
    stock = speculative_generate(target, draft, PROMPTS, **kw)
    graphs: list[str] = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    compile_modules(target, target.decoder_layers, "full", backend=recording_backend)
    compile_modules(draft, draft.layers, "light", backend=recording_backend)
    plain = speculative_generate(target, draft, PROMPTS, compile_level="full", **kw)
    assert graphs and not any("small_m_linear" in g for g in graphs)
    graphs.clear()
    torch._dynamo.utils.counters.clear()
    routed = speculative_generate(target, draft, PROMPTS, compile_level="full", linear_impl="triton", **kw)
    assert any("torch.ops.dflash2.small_m_linear" in g for g in graphs), "the compiled graphs did not take the op"
    breaks = torch._dynamo.utils.counters["graph_break"]
    assert all("row_attention" in reason for reason in breaks), dict(breaks)
    for a, b, c in zip(stock.sequences, plain.sequences, routed.sequences):
        assert a.tolist() == b.tolist() == c.tolist()
    assert routed.accepted == stock.accepted
