"""The draft's cached forward with the fused norm-RoPE kernel (`kernel_impl="triton"`, the
interpreter on CPU): two `dflash2.kernels.norm_rope` launches per layer (the block's queries; the
context's and the block's keys and values, projected together) in place of the module's norms,
RoPE and cache scatters, each finish conv with its residual and the next RMSNorm in one launch,
the MLP's SwiGLU product in one, the reference forward's hidden states and cache within
bf16 rounding over two drafting steps, and greedy speculative decoding with it still equal to AR.
(The GPU side: `tests/kernels/test_norm_rope.py` on CUDA and `benchmarks.step_profile`.)"""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.modeling import draft as draft_mod
from dflash2.modeling.cache import DraftContextCache
from dflash2.target import TargetModel
from tests.engine.helpers import fp32_target_draft_prompts

VOCAB = 300


@pytest.fixture
def triton_cpu():
    pytest.importorskip("triton")
    from dflash2.kernels.dispatch import triton_interpreter_enabled

    if not triton_interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")


def _two_steps(draft, kernel_impl, feats, noise):
    """Two drafting forwards into one cache (a 5-token context, then 3 more): hidden states, cache."""
    b = feats.shape[0]
    cache = draft.new_cache(b, 64)
    outs = []
    with torch.no_grad():
        for lo, hi, start in ((0, 5, 5), (5, 8, 8)):
            c = hi - lo
            block = start + torch.arange(noise.shape[1])[None].expand(b, -1)
            pos = torch.cat([torch.arange(lo, hi)[None].expand(b, c), block], 1)
            outs.append(draft(position_ids=pos, noise_embedding=noise, target_hidden=feats[:, lo:hi],
                              past_key_values=cache, kernel_impl=kernel_impl))
    return outs, cache


def test_fused_draft_forward_matches_the_reference_in_one_norm_rope_launch_a_layer(triton_cpu, monkeypatch):
    _, draft, _ = fp32_target_draft_prompts(VOCAB, layers=4)
    draft = draft.to(torch.bfloat16)
    cfg = draft.config
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(2, 8, cfg.hidden_size * len(cfg.target_layer_ids), generator=g).to(torch.bfloat16)
    noise = torch.randn(2, 4, cfg.hidden_size, generator=g).to(torch.bfloat16)
    ref, ref_cache = _two_steps(draft, "torch", feats, noise)

    launches, writes = [], []
    real_qkv, real_kv, real_write = (draft_mod.norm_rope_queries_and_cache, draft_mod.norm_rope_into_cache,
                                     DraftContextCache.write)
    monkeypatch.setattr(draft_mod, "norm_rope_queries_and_cache",
                        lambda *a, **k: launches.append("qkv") or real_qkv(*a, **k))
    monkeypatch.setattr(draft_mod, "norm_rope_into_cache", lambda *a, **k: launches.append("kv") or real_kv(*a, **k))
    monkeypatch.setattr(DraftContextCache, "write", lambda *a, **k: writes.append(1) or real_write(*a, **k))
    # each finish conv with its residual and the norm after it, and the MLP's SwiGLU product
    from dflash2.modeling import conv as conv_mod

    real_fn, real_sm = conv_mod.grouped_dynamic_conv_norm, draft_mod.silu_mul
    monkeypatch.setattr(conv_mod, "grouped_dynamic_conv_norm",
                        lambda *a, **k: launches.append("fn") or real_fn(*a, **k))
    monkeypatch.setattr(draft_mod, "silu_mul", lambda *a, **k: launches.append("mlp") or real_sm(*a, **k))
    fused, fused_cache = _two_steps(draft, "triton", feats, noise)
    layers = cfg.num_hidden_layers
    # per layer and step: the queries with the keys and values of context + block (one launch); the
    # attention's finish + norm; the MLP; its finish + the next norm
    assert launches == ["qkv", "fn", "mlp", "fn"] * layers * 2 and not writes

    for r, f in zip(ref, fused):
        assert (f.float() - r.float()).abs().max() <= 0.05 * r.float().abs().max()
    assert fused_cache.lengths.tolist() == ref_cache.lengths.tolist() == [8, 8]
    for layer in range(layers):
        k_ref, k_fused = ref_cache.keys[layer][:, :, :8].float(), fused_cache.keys[layer][:, :, :8].float()
        assert (k_fused - k_ref).abs().max() <= 2.0 ** -6 * k_ref.abs().max()  # a bf16 ulp or two
        # the context's values are v_proj of the same context features, copied as they are
        assert torch.equal(fused_cache.values[layer][:, :, :8], ref_cache.values[layer][:, :, :8])


def test_the_reference_path_is_taken_without_triton_or_for_other_dtypes(triton_cpu):
    _, draft, _ = fp32_target_draft_prompts(VOCAB, layers=2)
    attn = draft.layers[0].self_attn
    x = torch.zeros(1, 2, draft.config.hidden_size)
    cos = torch.zeros(1, 2, draft.config.head_dim)
    assert attn.fused_norm_rope(x, cos, "triton")
    assert not attn.fused_norm_rope(x, cos, "torch") and not attn.fused_norm_rope(x, cos, None)
    assert not attn.fused_norm_rope(x, cos.double(), "triton")  # a dtype the norms' weights do not share


def test_greedy_speculative_with_the_fused_draft_equals_ar(triton_cpu):
    target, draft, prompts = fp32_target_draft_prompts(VOCAB, layers=4)
    target = TargetModel(target)
    kw = dict(max_new_tokens=10, seed=0)
    ar = speculative_generate(target, None, prompts, **kw)
    spec = speculative_generate(target, draft, prompts, num_speculative_tokens=3, impl="triton", **kw)
    assert [s.tolist() for s in spec.sequences] == [s.tolist() for s in ar.sequences]


def test_the_drafts_projections_run_as_fused_launches(triton_cpu, monkeypatch):
    """Under the small-M linear mode (`linear_impl="triton"`) the draft's context and block rows
    take one q/k/v launch together, its MLP's gate/up another (`fusable_groups`) and the selector's
    gate with the LM head a third, each over the members' own weights; no member is launched alone,
    the context's k/v pair is not launched apart, and the tokens still equal AR's."""
    import dflash2.kernels.linear as linear

    target, draft, prompts = fp32_target_draft_prompts(VOCAB, layers=4)
    target = TargetModel(target)
    seen = []
    real = linear._small_m_linear_triton
    monkeypatch.setattr(linear, "_small_m_linear_triton", lambda x, w, *a, **k: seen.append(w) or real(x, w, *a, **k))
    kw = dict(max_new_tokens=6, seed=0)
    ar = speculative_generate(target, None, prompts, **kw)
    spec = speculative_generate(target, draft, prompts, num_speculative_tokens=3, impl="triton", linear_impl="triton",
                                **kw)
    assert [s.tolist() for s in spec.sequences] == [s.tolist() for s in ar.sequences]
    alone = {id(w) for w in seen if not isinstance(w, tuple)}
    fused = {tuple(id(m) for m in w) for w in seen if isinstance(w, tuple)}
    layer = draft.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert id(attn.o_proj.weight) in alone and id(mlp.down_proj.weight) in alone
    members = [lin.weight for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)]
    assert not {id(w) for w in members} & alone
    qkv, ctx_kv, gate_up = members[:3], members[1:3], members[3:]
    assert {tuple(map(id, qkv)), tuple(map(id, gate_up))} <= fused and tuple(map(id, ctx_kv)) not in fused
    # The selector's gate and the LM head read the draft's final states: one launch, the gate first.
    gate, head = draft.candidate_selector.hidden_projection.weight, target.lm_head_weight
    assert (id(gate), id(head)) in fused and id(gate) not in alone


def test_finish_norm_runs_the_module_path_where_the_kernel_does_not_apply(triton_cpu):
    """fp64, or a residual of another dtype (bf16 autocast training), takes the conv and then the
    norm module, exactly as the unfused layer did; fp32 takes the one launch, equal in `x`."""
    _, draft, _ = fp32_target_draft_prompts(VOCAB, layers=2)
    layer = draft.layers[0]
    conv, norm = layer.mlp_conv, layer.post_attention_layernorm
    g = torch.Generator().manual_seed(2)
    h = draft.config.hidden_size
    y, x = torch.randn(2, 4, h, generator=g), torch.randn(2, 4, h, generator=g)
    with torch.no_grad():
        conv.base_kernel.normal_(generator=g)
        d = torch.randn(2, 4, conv.kernel_projection.out_features, generator=g)
        for dtype in (torch.float64, None):  # None: an fp32 sublayer output on a residual of another dtype
            c, n = (conv.to(dtype), norm.to(dtype)) if dtype else (conv, norm)
            yy, dd = (y.to(dtype), d.to(dtype)) if dtype else (y, d)
            xx = x.to(dtype) if dtype else x.double()
            got = c.finish_norm(yy, dd, 4, "triton", xx, n)
            want_x = c(yy, dd, 1, 4, "triton", residual=xx)  # the separate call, then the module
            assert torch.equal(got[0], want_x) and torch.equal(got[1], n(want_x))
        conv.float(), norm.float()
        fused_x, _ = conv.finish_norm(y, d, 4, "triton", x, norm)
        assert torch.equal(fused_x, conv(y, d, 1, 4, "triton", residual=x))


def test_prepare_conv_writes_the_block_rows_where_the_stacked_projection_reads_them(triton_cpu, monkeypatch):
    """With the Triton kernels each layer's prepare conv writes into one `[context; block]` buffer,
    so no layer concatenates; the hidden states and caches are the bits of the concatenating path
    (the same rows into the same row-invariant projection)."""
    from dflash2.modeling.conv import GroupedDynamicConv

    _, draft, _ = fp32_target_draft_prompts(VOCAB, layers=4)
    cfg = draft.config
    g = torch.Generator().manual_seed(7)
    feats = torch.randn(2, 8, cfg.hidden_size * len(cfg.target_layer_ids), generator=g)
    noise = torch.randn(2, 4, cfg.hidden_size, generator=g)
    for layer in draft.layers:  # a conv that mixes taps, so the block rows differ from the conv's input
        with torch.no_grad():
            layer.attention_conv.base_kernel.normal_(generator=g)
    seen = []
    real = draft_mod._block_rows_of
    monkeypatch.setattr(draft_mod, "_block_rows_of", lambda *a: seen.append(real(*a)) or seen[-1])
    stacked, stacked_cache = _two_steps(draft, "triton", feats, noise)
    assert seen == [True] * cfg.num_hidden_layers * 2

    seen.clear()
    real_forward = GroupedDynamicConv.forward
    monkeypatch.setattr(GroupedDynamicConv, "forward", lambda self, *a, out=None, **k: real_forward(self, *a, **k))
    concatenated, cat_cache = _two_steps(draft, "triton", feats, noise)
    assert seen == [False] * cfg.num_hidden_layers * 2  # the conv ignored `out`: every layer concatenates
    for a, b in zip(stacked, concatenated):
        assert torch.equal(a, b)
    for layer in range(cfg.num_hidden_layers):
        assert torch.equal(stacked_cache.keys[layer], cat_cache.keys[layer])
        assert torch.equal(stacked_cache.values[layer], cat_cache.values[layer])
