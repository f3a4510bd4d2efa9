"""Exact mode through the batch-invariant kernels (`exact_impl="invariant"`), on the CPU under
Triton's interpreter: one batched forward per step at the block's own width (no row-by-row
forwards, no padding; the attention's query tile is fixed by `exact_block_size`), every target linear
through the small-M kernel at any row count, attention with fixed key splits, the norms' means
through the row-mean kernel; greedy speculative output equal to the exact AR output, each batch row
equal to the same prompt alone, the graph path (the CPU stand-in runner) equal to the eager loop.

On the CPU the stock kernels would give these equalities too; what these tests pin is the plumbing
(which kernels run, with which arguments, on which path) and the bookkeeping. The bf16 proof on
the H200 is `tests/gpu/test_exact_mode.py`.
"""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.engine import cache as cache_mod
from dflash2.engine.inputs import GenerateInputError, check_generate_inputs
from dflash2.engine.settings import EXACT_PREFILL_SPLIT_KEYS, EXACT_SPLIT_KEYS
from dflash2.evaluation.arms.oracle_proposers import OracleProposer
from dflash2.target import TargetModel
from tests.engine.helpers import tiny_qwen3
from tests.engine.test_graph_step import fake_graphs  # noqa: F401 (fixture)

V = 300
W = 8
PROMPTS = [torch.tensor([3, 1, 4, 1, 5, 9, 2, 6]), torch.tensor([2, 7, 1, 8, 2, 8]),
           torch.tensor([1, 4, 1, 4, 2, 1, 3, 5, 6, 2, 3])]
FIVE = PROMPTS + [torch.tensor([9, 9, 8, 2, 4]), torch.tensor([5, 3, 5, 8, 9, 7, 9])]  # 5 x W = 40 rows > 32
MAX_NEW = 6


@pytest.fixture(scope="module")
def target():
    pytest.importorskip("triton")
    from dflash2.kernels.dispatch import triton_interpreter_enabled

    if not triton_interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")
    return TargetModel(tiny_qwen3(vocab=V, hidden=64, layers=2, seed=0).to(torch.bfloat16).eval())


def _run(target, drafter, rows, max_new_tokens=MAX_NEW, **kw):
    return speculative_generate(target, drafter, rows, max_new_tokens=max_new_tokens, exact=True, exact_block_size=W,
                                exact_impl="invariant", **kw)


def _oracle(ar, accept_prob=0.9):
    return OracleProposer([s.tolist() for s in ar.sequences], seeds=list(range(len(ar.sequences))), block_size=W,
                          accept_prob=accept_prob, vocab_size=V)


def test_the_invariant_kernels_run_batched(target, monkeypatch):
    import dflash2.kernels.linear as linear
    import dflash2.kernels.row_mean as row_mean

    seen = {"linear_rows": [], "linear_w": set(), "means": 0, "splits": [], "forwards": []}
    real_lin, real_mean, real_attn = linear.small_m_linear, row_mean.row_mean, cache_mod.row_attention_kernel

    def lin(*a, **k):
        seen["linear_rows"].append(a[0].numel() // a[0].shape[-1])
        seen["linear_w"].add(a[1].data_ptr())
        return real_lin(*a, **k)

    def mean(*a, **k):
        seen["means"] += 1
        return real_mean(*a, **k)

    def attn(*a, **k):
        seen["splits"].append((a[0].shape[2], k.get("impl"), k.get("split_keys"), k.get("tile_queries")))
        return real_attn(*a, **k)

    monkeypatch.setattr(linear, "small_m_linear", lin)
    monkeypatch.setattr(row_mean, "row_mean", mean)
    monkeypatch.setattr(cache_mod, "row_attention_kernel", attn)
    hook = target.model.register_forward_pre_hook(
        lambda _m, args, kw: seen["forwards"].append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    b = len(FIVE)
    try:
        ar = _run(target, None, FIVE, max_new_tokens=3)
        ar_forwards = seen["forwards"][:]
        seen["forwards"].clear()
        spec = _run(target, _oracle(ar), FIVE, max_new_tokens=3, num_speculative_tokens=W - 1)
    finally:
        hook.remove()
    prefill = (b, max(p.numel() for p in FIVE))
    assert ar_forwards[0] == prefill and seen["forwards"][0] == prefill  # every prompt in one forward
    # Then one batched forward per step at the block's own width: 1 for AR, N + 1 for the verify.
    assert set(ar_forwards[1:]) == {(b, 1)} and set(seen["forwards"][1:]) == {(b, W)}
    assert b * W > 32 and b * W in seen["linear_rows"]  # past one row tile of the small-M kernel
    attn0 = target.model.model.layers[0].self_attn
    # each attention's q/k/v as one launch over their concatenated weights, as in normal mode
    assert attn0.o_proj.weight.data_ptr() in seen["linear_w"]
    assert not {lin.weight.data_ptr() for lin in (attn0.q_proj, attn0.k_proj, attn0.v_proj)} & seen["linear_w"]
    assert seen["means"] > 0
    assert b * prefill[1] in seen["linear_rows"]  # the prefill's linears through the small-M kernel too
    # The prefill and every step: fixed key splits (the prefill's own size) and a query tile fixed by
    # exact_block_size, whatever the width (the prompts run in tiles of it).
    assert set(seen["splits"]) == {(prefill[1], "triton", EXACT_PREFILL_SPLIT_KEYS, W),
                                   (1, "triton", EXACT_SPLIT_KEYS, W), (W, "triton", EXACT_SPLIT_KEYS, W)}
    assert EXACT_SPLIT_KEYS != EXACT_PREFILL_SPLIT_KEYS
    assert all(len(g) == 3 for g in ar.generated) and all(len(g) == 3 for g in spec.generated)


def test_speculative_equals_ar_and_rows_equal_alone(target):
    ar = _run(target, None, PROMPTS)
    alone = [_run(target, None, [p]) for p in PROMPTS]
    for i, one in enumerate(alone):
        assert torch.equal(one.sequences[0], ar.sequences[i]), f"row {i} changed with its batch"
    for n in (3, 7):
        spec = _run(target, _oracle(ar), PROMPTS, num_speculative_tokens=n)
        steps = sum(map(len, spec.accepted))
        assert sum(map(sum, spec.accepted)) / steps >= 1.0  # it really accepts
        for a, s in zip(ar.sequences, spec.sequences):
            assert torch.equal(a, s), f"N={n}"


def test_the_prefill_gives_each_row_its_own_bits_in_any_group(target, monkeypatch):
    """The invariant prefill: rows prefilled together, in groups of any size (a token budget that
    splits them), or alone give the same first logits, features and outputs bit for bit; features
    past a row's end are zero; a prompt longer than the query tile runs in tiles."""
    from dflash2.engine import prefill as prefill_mod
    from dflash2.engine.prefill import prefill_shape

    def groups(lengths, budget):
        return prefill_shape(lengths, max_len=64, bucket=0, invariant=True, tile=W, budget=budget).groups

    assert groups([8, 6, 11, 5], budget=24) == ((0, 2, 11), (2, 2, 11))  # 2 x 11 fits the budget, 3 x 11 does not
    assert groups([30, 4], budget=16) == ((0, 1, 30), (1, 1, 30))  # a prompt over the budget alone
    assert groups([4] * 5, budget=100) == ((0, 5, 4),)
    rows = PROMPTS + [torch.arange(1, 2 * W + 4)]  # 19 tokens: three query tiles of W
    captured = []
    real = prefill_mod.prefill_forward

    def spy(state, shape):
        assert shape.invariant and shape.tile == W
        out = real(state, shape)
        captured.append((out[0].clone(), None if out[1] is None else out[1].clone()))
        return out

    monkeypatch.setattr(prefill_mod, "prefill_forward", spy)

    def run(prompts, refs):
        oracle = _oracle(refs)
        oracle.target_layer_ids = [0, 1]  # the prefill then returns the target's features
        out = speculative_generate(target, oracle, prompts, max_new_tokens=4, exact=True, exact_block_size=W,
                                   exact_impl="invariant", num_speculative_tokens=3)
        return out, captured[-1]

    ar = speculative_generate(target, None, rows, max_new_tokens=4, exact=True, exact_block_size=W,
                              exact_impl="invariant")
    together, (logits, feats) = run(rows, ar)
    assert feats is not None and feats.shape[:2] == (len(rows), max(p.numel() for p in rows))
    monkeypatch.setattr(prefill_mod, "PREFILL_TOKENS", 20)  # groups of rows
    assert len(groups([p.numel() for p in rows], 20)) > 1
    grouped, (g_logits, g_feats) = run(rows, ar)
    assert torch.equal(g_logits, logits) and torch.equal(g_feats, feats)
    assert [s.tolist() for s in grouped.sequences] == [s.tolist() for s in together.sequences]
    for i, p in enumerate(rows):
        ar_one = speculative_generate(target, None, [p], max_new_tokens=4, exact=True, exact_block_size=W,
                                      exact_impl="invariant")
        one, (o_logits, o_feats) = run([p], ar_one)
        n = p.numel()
        assert torch.equal(o_logits[0], logits[i]), f"row {i}: first logits"
        assert torch.equal(o_feats[0, :n], feats[i, :n]), f"row {i}: features"
        assert not feats[i, n:].any()
        assert torch.equal(one.sequences[0], together.sequences[i]), f"row {i}: output"
        assert torch.equal(one.sequences[0], ar.sequences[i])


def test_the_graph_path_equals_the_eager_loop(target, fake_graphs):  # noqa: F811
    from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer

    eager = _run(target, None, PROMPTS, graphs=False)
    refs = [s.tolist() for s in eager.sequences]
    oracle = DeviceOracleProposer(refs, [1, 2, 3], block_size=W, accept_prob=0.8, vocab_size=V, device="cpu")
    for drafter, n in ((None, None), (oracle, 5)):
        graphed = _run(target, drafter, PROMPTS, graphs=True, num_speculative_tokens=n)
        assert [s.tolist() for s in graphed.sequences] == [s.tolist() for s in eager.sequences]
        assert fake_graphs and fake_graphs[-1].replays > 0


def test_exact_impl_is_resolved_and_checked(target):
    common = dict(max_new_tokens=2, num_speculative_tokens=None, temperature=0.0, top_p=1.0, top_k=0, seed=0,
                  stop_token_ids=None, impl="auto", timing=False, exact=True, exact_block_size=W)
    auto = check_generate_inputs(target, None, PROMPTS, **common).settings
    assert auto.exact_impl == "rows"  # auto: invariant on CUDA only; the interpreter would run it slowly here
    inv = check_generate_inputs(target, None, PROMPTS, exact_impl="invariant", **common).settings
    assert inv.invariant_exact and inv.exact_impl == "invariant"
    off = check_generate_inputs(target, None, PROMPTS, **{**common, "exact": False}).settings
    assert not off.invariant_exact
    with pytest.raises(GenerateInputError, match="exact_impl: is 'fast'"):
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, exact=True, exact_block_size=W,
                             exact_impl="fast")
    with pytest.raises(GenerateInputError, match="row-attention kernel does not take"):
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, exact=True, exact_block_size=65,
                             exact_impl="invariant")


def test_a_group_of_seven_heads_at_width_16():
    """Qwen2.5-0.5B's attention layout (14 query / 2 K/V heads: 7 x 16 = 112 tile rows at a block-16
    drafter's width) resolves to the invariant path, whose attention runs in head groups: greedy
    speculative output at N = 15, which accepts, equals the exact AR output, and each row alone
    equals its batch row."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dflash2.engine.inputs import resolve_exact_impl

    pytest.importorskip("triton")
    from dflash2.kernels.dispatch import triton_interpreter_enabled

    if not triton_interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")
    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=V, hidden_size=224, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096)
    tgt = TargetModel(Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval())
    width, prompts = 16, PROMPTS[:2]
    assert resolve_exact_impl("invariant", True, tgt, width) == "invariant"

    def run(drafter, rows, n=None):
        return speculative_generate(tgt, drafter, rows, max_new_tokens=MAX_NEW, exact=True, exact_block_size=width,
                                    exact_impl="invariant", num_speculative_tokens=n)

    ar = run(None, prompts)
    oracle = OracleProposer([s.tolist() for s in ar.sequences], seeds=[0, 1], block_size=width, accept_prob=0.9,
                            vocab_size=V)
    spec = run(oracle, prompts, width - 1)
    assert sum(map(sum, spec.accepted)) / sum(map(len, spec.accepted)) >= 1.0
    assert [s.tolist() for s in spec.sequences] == [s.tolist() for s in ar.sequences]
    alone = run(None, prompts[1:])
    assert torch.equal(alone.sequences[0], ar.sequences[1])


def test_exact_mode_takes_light_only(target):
    """Exact mode compiles at "light" with the invariant kernels and nowhere else: "full", and any
    level with `exact_impl="rows"`, are refused with one line naming both arguments."""
    with pytest.raises(GenerateInputError, match="compile_level: is 'full' with exact=True"):
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, exact=True, exact_block_size=W,
                             exact_impl="invariant", compile_level="full")
    for level in ("light", "full"):
        with pytest.raises(GenerateInputError, match=f"compile_level: is '{level}' with exact_impl='rows'"):
            speculative_generate(target, None, PROMPTS, max_new_tokens=2, exact=True, exact_block_size=W,
                                 exact_impl="rows", compile_level=level)


def test_compiled_exact_mode_keeps_the_invariant_operators():
    """Exact mode at compile level "light" (dynamo traced with a backend that records each graph and
    runs it as traced): inside the compiled norms and MLPs every mean is the `dflash2::row_mean`
    operator and every linear the `dflash2::small_m_linear` one (no aten mean or mm that Inductor
    would generate), dynamo ran without graph breaks, the strict recompile rule is on, and the output
    equals the uncompiled exact run's (AR and speculative), each batch row the prompt alone."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fresh = TargetModel(tiny_qwen3(vocab=V, hidden=64, layers=2, seed=0).to(torch.bfloat16).eval())
    stock_ar = _run(fresh, None, PROMPTS)
    stock_spec = _run(fresh, _oracle(stock_ar), PROMPTS, num_speculative_tokens=W - 1)
    from dflash2.engine.compiled import compile_modules

    config = torch._dynamo.config
    strict = config.fail_on_recompile_limit_hit
    torch._dynamo.reset()
    try:
        assert compile_modules(fresh, fresh.decoder_layers, "light", backend=recording) > 0
        torch._dynamo.utils.counters.clear()
        ar = _run(fresh, None, PROMPTS, compile_level="light")
        spec = _run(fresh, _oracle(ar), PROMPTS, num_speculative_tokens=W - 1, compile_level="light")
        alone = _run(fresh, None, PROMPTS[1:2], compile_level="light")
        assert config.fail_on_recompile_limit_hit
    finally:
        config.fail_on_recompile_limit_hit = strict
        torch._dynamo.reset()
    assert ar.settings.compile_level == "light" and ar.settings.invariant_exact
    assert [s.tolist() for s in ar.sequences] == [s.tolist() for s in stock_ar.sequences]
    assert [s.tolist() for s in spec.sequences] == [s.tolist() for s in stock_spec.sequences]
    assert [s.tolist() for s in spec.sequences] == [s.tolist() for s in ar.sequences]
    assert torch.equal(alone.sequences[0], ar.sequences[1])
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    targets = [str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert any("dflash2.row_mean" in t for t in targets) and any("dflash2.small_m_linear" in t for t in targets)
    leaked = [t for t in targets if "mean" in t and "dflash2" not in t or "linear" in t and "dflash2" not in t
              or t.endswith(("mm", "addmm", "matmul"))]
    assert not leaked, leaked
