"""Kernel choice resolved once per call and passed down (dflash2.engine.settings), on CPU.

Spies on the three places a kernel is chosen (the target's attention, the draft's cached
attention, the draft's conv) record which implementation each call of the engine used, then run
the reference so no Triton interpreter is needed. Two calls with different settings, one after
the other and in two threads at once, must each see only their own choice, leave nothing set on
the models, and give the tokens they give alone.
"""

from __future__ import annotations

import threading

import pytest
import torch

from dflash2 import DFlash2DraftModel, speculative_generate
from dflash2.engine import cache as cache_mod
from dflash2.engine import draft as engine_draft
from dflash2.engine import state as engine_state
from dflash2.engine import verify as engine_verify
from dflash2.engine.inputs import check_generate_inputs
from dflash2.engine.settings import EngineSettings
from dflash2.modeling import conv as conv_mod
from dflash2.modeling import draft as draft_mod
from dflash2.target import as_target
from tests.conftest import randomize_, tiny_draft_config, tiny_qwen3

VOCAB = 300
TORCH = dict(impl="torch", attention_impl="torch")
TRITON = dict(impl="triton", attention_impl="triton")


@pytest.fixture(scope="module")
def models():
    target = tiny_qwen3(vocab=VOCAB, hidden=64, layers=4, seed=0).float()
    # The engine wraps a plain HF model once and caches the wrapper on it (`dflash2.target.as_target`):
    # wrap it here, so "nothing was set on the models" holds whichever test of the module runs first.
    as_target(target)
    draft = randomize_(DFlash2DraftModel(tiny_draft_config(vocab=VOCAB, block_size=8)), seed=1, std=0.05).eval()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB - 1, (n,), generator=g) for n in (6, 11)]
    return target, draft, prompts


@pytest.fixture
def spies(monkeypatch):
    """Per thread, the kernels each choice point was asked for: {thread: {(point, impl), ...}}."""
    seen: dict[int, set] = {}
    lock = threading.Lock()

    def note(point, impl):
        with lock:
            seen.setdefault(threading.get_ident(), set()).add((point, impl))

    real_target = cache_mod.row_attention_kernel
    real_conv = conv_mod.grouped_dynamic_conv

    def target_kernel(*args, impl, **kw):
        note("target attention", impl)
        return real_target(*args, impl="torch", **kw)

    def draft_kernel(q, k, v, last, impl):
        note("draft attention", impl)
        b, nh, nq, _ = q.shape  # the kernel's contract: key slots <= last[b, i] are visible
        visible = torch.arange(k.shape[2])[None, None, None] <= last[:, None, :, None]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible,
                                                                enable_gqa=nh != k.shape[1]).transpose(1, 2)

    def conv(*args, impl, **kw):
        note("conv", impl)
        return real_conv(*args, impl="torch", **kw)

    def to_torch(point, real):
        def spy(*args, impl, **kw):
            note(point, impl)
            return real(*args, impl="torch", **kw)
        return spy

    # verify, top-k and the selector walk take the call's kernel_impl as well (as "kernels").
    for module, name in ((engine_state, "verify_block"), (engine_verify, "verify_block"),
                         (engine_draft, "vocab_topk"), (engine_draft, "selector_walk")):
        monkeypatch.setattr(module, name, to_torch("kernels", getattr(module, name)))
    monkeypatch.setattr(cache_mod, "row_attention_kernel", target_kernel)
    monkeypatch.setattr(draft_mod, "row_attention", draft_kernel)
    monkeypatch.setattr(conv_mod, "grouped_dynamic_conv", conv)
    for name in ("norm_rope_queries_and_cache", "norm_rope_into_cache"):  # the draft's fused norm-RoPE (kernel_impl)
        monkeypatch.setattr(draft_mod, name, to_torch("draft norm-rope", getattr(draft_mod, name)))
    monkeypatch.setattr(draft_mod, "triton_interpreter_enabled", lambda: True)  # the draft may pick "triton"
    return seen


def _run(models, settings):
    target, draft, prompts = models
    return speculative_generate(target, draft, prompts, max_new_tokens=10, num_speculative_tokens=3, **settings)


def _model_state(target, draft):
    convs = [c.impl for layer in draft.layers for c in (layer.attention_conv, layer.mlp_conv) if c is not None]
    return (target.config._attn_implementation, sorted(k for k in draft.__dict__ if "impl" in k), convs,
            sorted(k for k in target.__dict__ if k.startswith("_dflash2")))


def test_settings_are_resolved_once_by_the_input_checks(models):
    target, draft, prompts = models
    checked = check_generate_inputs(target, draft, prompts, max_new_tokens=4, num_speculative_tokens=3,
                                    temperature=0.0, top_p=1.0, top_k=0, seed=None, stop_token_ids=None, impl="auto",
                                    timing=False, attention_impl="auto")
    assert checked.settings == EngineSettings(kernel_impl="torch", attention_impl="torch", exact_block_size=8)
    with pytest.raises(AttributeError):
        checked.settings.kernel_impl = "triton"  # frozen
    with pytest.raises(ValueError, match="resolved"):
        EngineSettings(kernel_impl="auto", attention_impl="torch")


def test_calls_with_different_settings_do_not_interfere(models, spies):
    target, draft, _ = models
    before = _model_state(target, draft)
    alone = _run(models, TORCH)
    torch_points = {("target attention", "torch"), ("conv", "torch"), ("kernels", "torch")}
    assert spies.pop(threading.get_ident()) == torch_points
    other = _run(models, TRITON)
    assert spies.pop(threading.get_ident()) == {("target attention", "triton"), ("draft attention", "triton"),
                                                ("conv", "triton"), ("kernels", "triton"),
                                                ("draft norm-rope", "triton")}
    again = _run(models, TORCH)
    assert spies.pop(threading.get_ident()) == torch_points
    assert [s.tolist() for s in again.sequences] == [s.tolist() for s in alone.sequences]
    assert [s.tolist() for s in other.sequences] == [s.tolist() for s in alone.sequences]  # same math here
    assert _model_state(target, draft) == before  # nothing was set on the models


def test_two_threads_with_different_settings_do_not_interfere(models, spies):
    target, draft, _ = models
    alone = _run(models, TORCH)
    spies.clear()
    results, errors = {}, []
    start = threading.Barrier(2)

    def work(name, settings):
        try:
            start.wait()
            for _ in range(2):
                results[name, threading.get_ident()] = _run(models, settings)
        except Exception as e:  # noqa: BLE001  (re-raised below, in the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(name, s)) for name, s in (("torch", TORCH), ("triton", TRITON))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (name, ident), out in results.items():
        assert {impl for _, impl in spies[ident]} == {name}  # each thread saw only its own kernels
        assert [s.tolist() for s in out.sequences] == [s.tolist() for s in alone.sequences]
    assert target.config._attn_implementation != cache_mod.ATTN_IMPLEMENTATION  # restored after both
