"""DFlash2 draft model: conv vs the formula, identity init == v1, selector vs a loop, caching,
masks."""

from __future__ import annotations

import pytest
import torch

from dflash2.modeling import CandidateSelector, DFlash2DraftModel, GroupedDynamicConv
from tests.conftest import randomize_, tiny_draft_config
from tests.formulas import conv_loop


@pytest.mark.parametrize("K", [1, 2, 3])
@pytest.mark.parametrize("g", [1, 4, 8])
@pytest.mark.parametrize("side", [0, 1])
def test_conv_matches_formula_loop_across_block_boundaries(K, g, side):
    torch.manual_seed(100 * K + g + side)
    H, T, block_len = 8, 10, 5  # two blocks: taps must not reach across position 5
    conv = GroupedDynamicConv(H, K, g, impl="torch")
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    z = torch.randn(2, T, H)
    u = torch.randn(2, T, H)
    proj = conv.project(u)
    with torch.no_grad():
        got = conv(z, proj, side, block_len)
    want = conv_loop(z, conv.base_kernel.detach(), proj.detach(), side, block_len, g)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_conv_identity_init_is_exact_identity():
    conv = GroupedDynamicConv(16, 3, 4, impl="torch")
    z = torch.randn(2, 7, 16)
    proj = conv.project(torch.randn(2, 7, 16))
    assert torch.equal(conv(z, proj, 0, 7), z) and torch.equal(conv(z, proj, 1, 7), z)


def _inputs(cfg, B=2, ctx=6, q=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = len(cfg.target_layer_ids)
    target_hidden = torch.randn(B, ctx, n * cfg.hidden_size, generator=g)
    noise = torch.randn(B, q, cfg.hidden_size, generator=g)
    pos = torch.arange(ctx + q)[None].expand(B, -1)
    return pos, noise, target_hidden


def test_identity_init_dflash2_equals_same_weights_as_v1():
    torch.manual_seed(0)
    v2 = DFlash2DraftModel(tiny_draft_config(v2=True)).eval()
    randomize_(v2, seed=1)
    v2.reset_dflash2_parts()  # random backbone, identity conv + selector
    v1 = DFlash2DraftModel(tiny_draft_config(v2=False)).eval()
    missing, unexpected = v1.load_state_dict(v2.state_dict(), strict=False)
    assert not missing and all("conv" in k or "candidate_selector" in k for k in unexpected)
    pos, noise, th = _inputs(v2.config)
    with torch.no_grad():
        assert torch.equal(v2(pos, noise, th), v1(pos, noise, th))


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_each_sublayer_adds_its_residual_inside_the_finish_conv(monkeypatch, grad):
    """A layer's two `x + conv_finish(y)` run as one conv call each (`residual=x`: one launch with
    the Triton conv), the prepare sides without one; with grad on, gradients still reach x."""
    from dflash2.modeling import conv as conv_mod

    model = randomize_(DFlash2DraftModel(tiny_draft_config(v2=True)), seed=4)
    calls, real = [], conv_mod.grouped_dynamic_conv
    monkeypatch.setattr(conv_mod, "grouped_dynamic_conv",
                        lambda *a, residual=None, **k: calls.append((a[3], residual is not None))
                        or real(*a, residual=residual, **k))
    pos, noise, th = _inputs(model.config)
    noise.requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = model(pos, noise, th)
    assert calls == [(0, False), (1, True)] * 2 * model.config.num_hidden_layers
    if grad:
        out.sum().backward()
        assert noise.grad is not None and noise.grad.abs().sum() > 0


def test_bf16_autocast_training_forward_promotes_the_residual_as_before():
    """Under bf16 autocast (GPU distillation's mixed precision; CPU autocast here) a layer's residual
    stream stays fp32 while its sublayers' outputs are bf16: the finish conv then adds the residual
    with PyTorch's promotion, the output equals the unfused `x + conv_finish(y)` bit for bit, and
    gradients flow."""
    from dflash2.modeling import conv as conv_mod

    model = randomize_(DFlash2DraftModel(tiny_draft_config(v2=True)), seed=6)
    pos, noise, th = _inputs(model.config)
    noise.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(pos, noise, th)
    out.float().sum().backward()
    assert noise.grad is not None and torch.isfinite(noise.grad).all() and noise.grad.abs().sum() > 0

    real_forward = conv_mod.GroupedDynamicConv.forward

    def unfused(self, z, proj, side, block_len, impl=None, residual=None):  # the form before the fusion
        out = real_forward(self, z, proj, side, block_len, impl)
        return out if residual is None else residual + out

    conv_mod.GroupedDynamicConv.forward = unfused
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            ref = model(pos, noise.detach(), th)
    finally:
        conv_mod.GroupedDynamicConv.forward = real_forward
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(pos, noise.detach(), th)
    assert got.dtype == ref.dtype and torch.equal(got, ref)


def test_trained_conv_changes_output_and_is_differentiable():
    model = randomize_(DFlash2DraftModel(tiny_draft_config()), seed=2)
    pos, noise, th = _inputs(model.config)
    out = model(pos, noise, th)
    out.square().mean().backward()
    conv = model.layers[0].attention_conv
    assert conv.base_kernel.grad is not None and conv.kernel_projection.weight.grad.abs().sum() > 0
    model.reset_dflash2_parts()
    with torch.no_grad():
        assert not torch.allclose(out, model(pos, noise, th))


def test_selector_scores_match_explicit_loop():
    torch.manual_seed(3)
    H, V, R, k = 12, 40, 5, 4
    sel = CandidateSelector(H, V, R)
    with torch.no_grad():
        sel.successor_codebook.normal_()
    h = torch.randn(3, H)
    unary = torch.randn(3, k)
    cand = torch.randint(0, V, (3, k))
    pred = torch.randint(0, V, (3,))
    with torch.no_grad():
        got = sel.scores(unary, cand, pred, h)
    A, Z, W = (p.detach().double() for p in (sel.predecessor_codebook, sel.successor_codebook,
                                               sel.hidden_projection.weight))
    for j in range(3):
        eta = W @ h[j].double()
        for c in range(k):
            want = float(unary[j, c]) + sum(float(A[pred[j], r] * eta[r] * Z[cand[j, c], r]) for r in range(R))
            assert abs(float(got[j, c]) - want) < 1e-5
    assert got.dtype == torch.float32


def test_selector_identity_scores_equal_unary():
    sel = CandidateSelector(8, 20, 4)
    unary = torch.randn(2, 3, 5)
    out = sel.scores(unary, torch.randint(0, 20, (2, 3, 5)), torch.randint(0, 20, (2, 3)), torch.randn(2, 3, 8))
    assert torch.equal(out, unary)


def test_cached_forward_equals_full_forward_with_uneven_rows():
    """Context appended in chunks with per-row counts == one cache-free forward per row."""
    model = randomize_(DFlash2DraftModel(tiny_draft_config()), seed=4).eval()
    cfg = model.config
    n, H, q = len(cfg.target_layer_ids), cfg.hidden_size, 4
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(2, 12, n * H, generator=g)
    cache = model.new_cache(batch_size=2, max_len=32)
    chunks = [(torch.tensor([5, 3]), 5), (torch.tensor([2, 4]), 4)]  # (counts per row, chunk width)
    lengths = torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        for counts, width in chunks:
            new = torch.stack([feats[b, lengths[b]:lengths[b] + width] for b in range(2)])  # within the 12
            start = lengths + counts  # anchor position per row
            ctx_pos = lengths[:, None] + torch.arange(width)
            blk_pos = start[:, None] + torch.arange(q)
            noise = torch.randn(2, q, H, generator=g)
            out = model(torch.cat([ctx_pos, blk_pos], 1), noise, new, past_key_values=cache, context_lengths=counts)
            for b in range(2):
                L = int(start[b])
                ref = model(torch.arange(L + q)[None], noise[b:b + 1], feats[b:b + 1, :L])
                torch.testing.assert_close(out[b:b + 1], ref, rtol=1e-5, atol=1e-5)
            lengths = start
    assert cache.lengths.tolist() == [7, 7]


def _cached_steps(model, impl: str):
    """Three cached drafting steps over uneven rows (per-row context counts) with `impl` attention."""
    cfg = model.config
    n, H, q = len(cfg.target_layer_ids), cfg.hidden_size, 4
    g = torch.Generator().manual_seed(11)
    cache = model.new_cache(batch_size=2, max_len=40)
    lengths, outs = torch.zeros(2, dtype=torch.long), []
    with torch.no_grad():
        for counts, width in ((torch.tensor([6, 3]), 6), (torch.tensor([2, 5]), 5), (torch.tensor([4, 1]), 5)):
            start = lengths + counts
            pos = torch.cat([lengths[:, None] + torch.arange(width), start[:, None] + torch.arange(q)], 1)
            noise = torch.randn(2, q, H, generator=g)
            outs.append(model(pos, noise, torch.randn(2, width, n * H, generator=g), past_key_values=cache,
                              context_lengths=counts, attention_impl=impl))
            lengths = start
    return outs


def test_step_slots_send_padding_context_entries_to_the_unread_trash_slot():
    """`StepSlots.both`: each row's valid context entries at its length on, its padding entries at
    the cache's trash slot `max_len`, then its block right after the valid entries; the buffers hold
    that one slot more than `readable` shows."""
    from dflash2.modeling.cache import DraftContextCache, StepSlots

    cache = DraftContextCache(1, 2, 10, 1, 4, dtype=torch.float32, device="cpu")
    cache.lengths = torch.tensor([3, 0])
    counts = torch.tensor([2, 3])
    first_blk = cache.lengths + counts
    slots = StepSlots(cache, counts, first_blk, 3, 2)
    assert slots.both.tolist() == [[3, 4, 10, 5, 6], [0, 1, 2, 3, 4]]
    assert cache.keys[0].shape[2] == 11 and all(t.shape[2] == 10 for t in cache.readable(0))


def _steps_into(model, cache, dtype):
    """`_cached_steps`' three drafting steps (uneven rows) into `cache`, inputs in `dtype`."""
    cfg = model.config
    n, H, q = len(cfg.target_layer_ids), cfg.hidden_size, 4
    g = torch.Generator().manual_seed(11)
    lengths, outs = torch.zeros(2, dtype=torch.long), []
    with torch.no_grad():
        for counts, width in ((torch.tensor([6, 3]), 6), (torch.tensor([2, 5]), 5), (torch.tensor([4, 1]), 5)):
            start = lengths + counts
            pos = torch.cat([lengths[:, None] + torch.arange(width), start[:, None] + torch.arange(q)], 1)
            noise = torch.randn(2, q, H, generator=g).to(dtype)
            feats = torch.randn(2, width, n * H, generator=g).to(dtype)
            outs.append(model(pos, noise, feats, past_key_values=cache, context_lengths=counts))
            lengths = start
    return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cached_steps_gather_rope_from_the_table_with_the_modules_bits(monkeypatch, dtype):
    """A cache made by `new_cache` holds the draft's RoPE table (`rope_table`): cached drafting
    steps gather cos / sin from it, without calling the rotary module, and give the same hidden
    states and cache bit for bit as steps that compute them (a cache without a table); a RoPE type
    whose angles depend on the sequence length gets no table."""
    model = randomize_(DFlash2DraftModel(tiny_draft_config()), seed=4).eval().to(dtype)
    table_cache = model.new_cache(batch_size=2, max_len=40)
    assert table_cache.rope is not None and table_cache.rope.dtype == dtype
    plain_cache = model.new_cache(batch_size=2, max_len=40)
    plain_cache.rope = None
    calls = []
    real = model.rotary_emb.forward
    monkeypatch.setattr(model.rotary_emb, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    gathered = _steps_into(model, table_cache, dtype)
    assert calls == []
    computed = _steps_into(model, plain_cache, dtype)
    assert len(calls) == 3
    for a, b in zip(gathered, computed):
        assert torch.equal(a, b)
    for layer in range(model.config.num_hidden_layers):
        assert torch.equal(table_cache.keys[layer], plain_cache.keys[layer])
        assert torch.equal(table_cache.values[layer], plain_cache.values[layer])
    monkeypatch.setattr(model.rotary_emb, "rope_type", "dynamic")
    assert model.rope_table(8, dtype, "cpu") is None


@pytest.mark.parametrize("variant", ["bidirectional", "causal", "window"])
def test_cached_attention_kernel_equals_the_masked_reference(variant):
    """The cached (inference) attention through the split-key Triton kernel (interpreter on CPU)
    equals SDPA with the visibility mask; a windowed layer keeps the mask (the kernel's window is
    causal-relative), so it must match too."""
    pytest.importorskip("triton")
    from dflash2.kernels.dispatch import triton_interpreter_enabled

    if not triton_interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")
    cfg = tiny_draft_config()
    if variant == "causal":
        cfg.is_causal = True
    if variant == "window":
        cfg.use_sliding_window, cfg.sliding_window, cfg.layer_types = True, 6, ["sliding_attention"] * 2
    model = randomize_(DFlash2DraftModel(cfg), seed=12).eval()
    ref, out = _cached_steps(model, "torch"), _cached_steps(model, "triton")
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="resolved"):
        _cached_steps(model, "auto")


def _sensitivity(model, change_ctx_at=None, change_blk_at=None):
    pos, noise, th = _inputs(model.config, B=1, ctx=6, q=5, seed=9)
    with torch.no_grad():
        base = model(pos, noise, th)
        noise2, th2 = noise.clone(), th.clone()
        if change_blk_at is not None:
            noise2[:, change_blk_at] += 1.0
        if change_ctx_at is not None:
            th2[:, change_ctx_at] += 1.0
        return (model(pos, noise2, th2) - base).abs().amax(-1)[0]  # [q]


def test_block_is_bidirectional_by_default_and_causal_when_configured():
    cfg = tiny_draft_config()
    model = randomize_(DFlash2DraftModel(cfg), seed=6).eval()
    assert _sensitivity(model, change_blk_at=4)[0] > 0  # slot 0 sees slot 4
    cfg_c = tiny_draft_config()
    cfg_c.is_causal = True
    causal = DFlash2DraftModel(cfg_c).eval()
    causal.load_state_dict(model.state_dict())
    diff = _sensitivity(causal, change_blk_at=3)
    assert torch.all(diff[:3] == 0) and diff[3:].min() > 0


def test_sliding_window_hides_far_context():
    cfg = tiny_draft_config()
    cfg.use_sliding_window, cfg.sliding_window = True, 4
    cfg.layer_types = ["sliding_attention"] * 2
    cfg.is_causal = False
    model = randomize_(DFlash2DraftModel(cfg), seed=7).eval()
    # block positions 6..10; context position 0 is >= 4 away from all of them, position 5 is not.
    assert torch.all(_sensitivity(model, change_ctx_at=0) == 0)
    assert _sensitivity(model, change_ctx_at=5)[0] > 0
    # the boundary (spec: visible iff |query - key| < W): position 2 is exactly 4 away, 3 is 3 away
    assert torch.all(_sensitivity(model, change_ctx_at=2) == 0)
    assert _sensitivity(model, change_ctx_at=3)[0] > 0


def test_head_logits_apply_multiplier_then_softcap():
    cfg = tiny_draft_config(output_multiplier=0.5, final_logit_softcapping=3.0)
    model = DFlash2DraftModel(cfg)
    head = torch.nn.Linear(64, 300, bias=False)
    h = torch.randn(2, 3, 64) * 4
    z = head(h).double() * 0.5
    torch.testing.assert_close(model.head_logits(h, head).double(), 3.0 * torch.tanh(z / 3.0), rtol=1e-5, atol=1e-5)
    plain = DFlash2DraftModel(tiny_draft_config())
    assert torch.equal(plain.head_logits(h, head), head(h).float())
