"""Regional torch.compile of target and draft (`dflash2.engine.compiled`, `compile_level`) on CPU.

The compile runs with dynamo's `eager` backend here (tracing, guards and graph breaks are the
same as with Inductor; no code generation, so the outputs must be bit-identical to the stock
run). The GPU runs Inductor: `tests/gpu/test_compiled.py`.
"""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.engine.compiled import COMPILED_FLAG, _light_parts, compile_modules
from dflash2.engine.inputs import GenerateInputError
from dflash2.target import TargetModel, as_target
from tests.conftest import tiny_llama, tiny_qwen3
from tests.engine.helpers import random_draft

V = 300
PROMPTS = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([7, 8, 9, 10, 11, 12, 13, 14, 15])]


def _fresh_draft():
    # Not the helpers' cached instance: compiles (and dtype casts) work in place.
    return random_draft.__wrapped__(vocab=V).float()


def _names(root, parts):
    by_id = {id(m): n for n, m in root.named_modules()}
    return sorted(by_id[id(p)] for p in parts)


def test_light_parts_are_the_norms_and_mlps_once_each_without_hooked_modules():
    target = TargetModel(tiny_qwen3(vocab=V, layers=2), layer_ids=[0, 1])
    names = _names(target, _light_parts(target))
    layer = ["input_layernorm", "mlp", "post_attention_layernorm", "self_attn.k_norm", "self_attn.q_norm"]
    # Each layer once (TargetModel registers the decoder layers a second time as decoder_layers);
    # the final norm carries the last-layer feature hook, so it stays uncompiled.
    assert names == [f"model.model.layers.{i}.{p}" for i in range(2) for p in layer]
    assert not any(n.endswith("model.model.norm") for n in names)
    draft = _fresh_draft()
    draft_names = _names(draft, _light_parts(draft))
    assert "hidden_norm" in draft_names and "norm" in draft_names and "layers.0.mlp" in draft_names
    assert not any(".mlp." in n for n in draft_names)  # outermost match only


@pytest.mark.parametrize("make", [tiny_qwen3, tiny_llama], ids=["qwen3", "llama"])
def test_compiled_light_equals_stock_and_is_lossless(make):
    target = TargetModel(make(vocab=V, layers=3))
    draft = _fresh_draft()
    stock = [speculative_generate(target, d, PROMPTS, max_new_tokens=12, seed=0) for d in (None, draft)]
    assert compile_modules(target, target.decoder_layers, "light", backend="eager") > 0
    assert compile_modules(draft, draft.layers, "light", backend="eager") > 0
    torch._dynamo.utils.counters.clear()
    out = [speculative_generate(target, d, PROMPTS, max_new_tokens=12, seed=0, compile_level="light")
           for d in (None, draft)]
    for a, b in zip(stock, out):
        assert [s.tolist() for s in a.sequences] == [s.tolist() for s in b.sequences]
    assert [s.tolist() for s in out[1].sequences] == [s.tolist() for s in out[0].sequences]  # lossless
    stats = torch._dynamo.utils.counters
    assert stats["stats"]["unique_graphs"] > 0  # the compiled code ran (not a silent no-op)
    assert not stats["graph_break"], dict(stats["graph_break"])


def test_compiled_full_breaks_only_at_the_attention_call():
    target = TargetModel(tiny_qwen3(vocab=V, layers=2))
    stock = speculative_generate(target, None, PROMPTS, max_new_tokens=6)
    compile_modules(target, target.decoder_layers, "full", backend="eager")
    torch._dynamo.utils.counters.clear()
    out = speculative_generate(target, None, PROMPTS, max_new_tokens=6, compile_level="full")
    assert [s.tolist() for s in out.sequences] == [s.tolist() for s in stock.sequences]
    breaks = torch._dynamo.utils.counters["graph_break"]
    assert breaks and all("row_attention" in reason for reason in breaks), dict(breaks)


def test_light_raises_the_recompile_limit_over_its_entries():
    """The light frames (one norm forward for every layer and model) get an entry per rank, size-1
    specialization and function-mode stack; `compile_modules` lifts dynamo's limit to cover them."""
    from dflash2.engine.compiled import LIGHT_RECOMPILE_LIMIT

    config = torch._dynamo.config
    old = config.recompile_limit
    try:
        config.recompile_limit = 8
        target = TargetModel(tiny_qwen3(vocab=V, layers=2))
        compile_modules(target, target.decoder_layers, "light", backend="eager")
        assert config.recompile_limit == LIGHT_RECOMPILE_LIMIT > 8
    finally:
        config.recompile_limit = old


def test_compile_levels_are_checked():
    target = TargetModel(tiny_qwen3(vocab=V, layers=1))
    with pytest.raises(ValueError, match="use one of"):
        compile_modules(target, target.decoder_layers, "max")
    compile_modules(target, target.decoder_layers, "light", backend="eager")
    assert getattr(target.model, COMPILED_FLAG) == ("light", "eager")
    assert compile_modules(target, target.decoder_layers, "light") == 0  # idempotent, keeps its backend
    again = TargetModel(target.model)  # what speculative_generate makes of a plain HF model, per call
    assert compile_modules(again, again.decoder_layers, "light") == 0
    with pytest.raises(ValueError, match="compiled at level 'light', not 'full'"):
        compile_modules(target, target.decoder_layers, "full")
    with pytest.raises(GenerateInputError, match="compile_level"):
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, compile_level="fast")
    with pytest.raises(GenerateInputError, match="exact_impl='rows'"):  # the CPU's exact mode: rows
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, compile_level="light", exact=True,
                             exact_block_size=4)


def test_auto_compile_and_linear_resolve_per_device_and_exact_mode():
    """The defaults (`compile_level="auto"`, `linear_impl="auto"`): light and the small-M kernel on
    CUDA in normal mode; light with the invariant exact kernels, none with exact "rows"; off and
    `F.linear` on the CPU. Explicit levels exact mode cannot run are refused in one line."""
    from dflash2.engine.inputs import resolve_compile, resolve_linear
    from dflash2.kernels.dispatch import triton_available

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    on_cuda = "light" if triton_available() else None
    assert resolve_compile("auto", cuda, False, "invariant") == on_cuda
    assert resolve_compile("auto", cuda, True, "invariant") == on_cuda
    assert resolve_compile("auto", cuda, True, "rows") is None
    assert resolve_compile("auto", cpu, False, "rows") is None
    assert resolve_compile(None, cuda, False, "invariant") is None
    assert resolve_compile("light", cuda, True, "invariant") == "light"
    assert resolve_compile("full", cuda, False, "invariant") == "full"
    with pytest.raises(GenerateInputError, match="compile_level: is 'full' with exact=True"):
        resolve_compile("full", cuda, True, "invariant")
    for level in ("light", "full"):
        with pytest.raises(GenerateInputError, match=f"compile_level: is '{level}' with exact_impl='rows'"):
            resolve_compile(level, cuda, True, "rows")
    with pytest.raises(GenerateInputError, match="compile_level: is 'fast'"):
        resolve_compile("fast", cpu, False, "rows")
    assert resolve_linear("auto", cuda, False) == ("triton" if triton_available() else "torch")
    assert resolve_linear("auto", cuda, True) == "torch" == resolve_linear("auto", cpu, False)
    with pytest.raises(GenerateInputError, match="linear_impl: is 'triton' with exact=True"):
        resolve_linear("triton", cuda, True)
    target = TargetModel(tiny_qwen3(vocab=V, layers=1))
    out = speculative_generate(target, None, PROMPTS, max_new_tokens=2)
    assert out.settings.compile_level is None and out.settings.linear_impl == "torch"  # the CPU's defaults


def test_attention_masks_are_built_once_per_forward_by_the_cache(monkeypatch):
    """`StaticTargetCache.attention_kwargs`: the mask path gets one mask per window for all layers
    of a forward (not one per layer), the Triton path for a block none; the attention uses them."""
    from dflash2.engine import cache as cache_mod
    from tests.engine.helpers import qwen3_target

    model = qwen3_target(vocab=V, sliding=True)  # layer 0 full, layers 1..3 a 6-token window
    cache = cache_mod.StaticTargetCache(model.config, 2, 16, model.dtype, "cpu")
    assert cache.windows == [cache_mod.FULL_WINDOW, 6]
    built = []
    real = cache_mod.visible_mask
    monkeypatch.setattr(cache_mod, "visible_mask", lambda *a: built.append(a[-1]) or real(*a))
    pos = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]])
    cache.prepare(pos, kv_len=8)
    kw = cache.attention_kwargs("torch")
    assert built == [None, 6] and kw["dfl2_kernel"] == "torch" and not kw["dfl2_exact"]
    expect = torch.arange(8)[None, None, :] <= pos[:, :, None]
    assert torch.equal(kw["dfl2_masks"][cache_mod.FULL_WINDOW], expect)
    assert torch.equal(kw["dfl2_masks"][6], expect & (torch.arange(8)[None, None, :] > pos[:, :, None] - 6))
    with torch.no_grad(), cache_mod.static_attention(model):
        as_target(model)(pos, position_ids=pos, past_key_values=cache, **kw)
    assert built == [None, 6]  # the four layers read the prebuilt masks
    cache.prepare(pos[:, :1], kv_len=8)
    assert cache.attention_kwargs("triton") == {"dfl2_kernel": "triton", "dfl2_exact": False}  # a block: no mask


def test_draft_head_reads_contiguous_rows():
    """The draft's LM head gets a contiguous `[B, N, H]` input: one GEMM over B*N rows (on a
    strided slice F.linear ran a batched GEMM that re-read the head per row: 9.3 ms at batch 32)."""
    target = TargetModel(tiny_qwen3(vocab=V, layers=3))
    draft = _fresh_draft()
    seen = []
    hook = target.model.lm_head.register_forward_hook(lambda m, inp, out: seen.append(inp[0].is_contiguous()))
    try:
        speculative_generate(target, draft, PROMPTS, max_new_tokens=6, num_speculative_tokens=3)
    finally:
        hook.remove()
    assert seen and all(seen)


def test_compile_level_none_runs_the_stock_code_of_a_compiled_model():
    """A call with compile_level=None on a model an earlier call compiled runs none of the compiled
    code (what exact mode "rows" and every uncompiled figure rely on), and gives the stock output."""
    runs = []

    def counting(gm, example_inputs):
        def run(*args):
            runs.append(1)
            return gm.forward(*args)
        return run

    target = TargetModel(tiny_qwen3(vocab=V, layers=2))
    stock = speculative_generate(target, None, PROMPTS, max_new_tokens=6)
    torch._dynamo.reset()
    try:
        compile_modules(target, target.decoder_layers, "light", backend=counting)
        compiled = speculative_generate(target, None, PROMPTS, max_new_tokens=6, compile_level="light")
        assert runs, "the compiled code did not run"
        runs.clear()
        again = speculative_generate(target, None, PROMPTS, max_new_tokens=6, compile_level=None)
        assert not runs, f"{len(runs)} compiled graph runs in a call with compile_level=None"
    finally:
        torch._dynamo.reset()
    for out in (compiled, again):
        assert [s.tolist() for s in out.sequences] == [s.tolist() for s in stock.sequences]
