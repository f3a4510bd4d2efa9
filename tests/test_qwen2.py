"""Qwen2 targets (Qwen2.5-Coder's architecture) through the stock transformers modules.

Qwen2 differs from the Qwen3 / Llama targets the other tests use in its attention: q/k/v
projections carry a bias (no q/k norm), head_dim is hidden_size / heads, the RoPE base of the
real models is 1e6, and the head is tied (0.5B upstream) or untied (1.5B). The tiny random
models here get *non-zero* random biases (transformers initializes them to zero, which would
hide a dropped bias) and that RoPE base. Checked: TargetModel features, greedy speculative ==
transformers `generate` (tied and untied head, a random draft and an always-accepted oracle),
the sampled (T > 0) law against the exact one, exact mode, a new drafter's shapes, and a short
distillation whose loss falls.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from transformers import AutoModelForCausalLM

from dflash2.engine import speculative_generate
from dflash2.evaluation.arms.oracle_proposers import OracleProposer
from dflash2.runconfig import DraftSpec, TargetSpec, new_draft, random_target_config
from dflash2.target import TargetModel
from tests.engine.helpers import GreedyOracle, hf_greedy, random_draft
from tests.engine.test_sampling import chi_square_pvalue

VOCAB = 300
ROPE_BASE = 1_000_000.0


def qwen2_spec(vocab: int = VOCAB, tied: bool = False) -> TargetSpec:
    return TargetSpec(name=f"tiny-qwen2-{'tied' if tied else 'untied'}", architecture="qwen2", tokenizer=None,
                      hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=vocab, max_position_embeddings=4096,
                      rope_theta=ROPE_BASE, tie_word_embeddings=tied)


@functools.cache
def qwen2_target(vocab: int = VOCAB, tied: bool = False, head_scale: float = 1.0, seed: int = 0):
    """Tiny random `Qwen2ForCausalLM` (fp64) with random QKV biases of scale 0.5."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(random_target_config(qwen2_spec(vocab, tied)), dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=g, dtype=torch.float64) * 0.5)
        model.lm_head.weight.mul_(head_scale)  # tied: scales the input embedding too (same tensor)
    return model.eval()


def random_prompts(n: int, vocab: int = VOCAB, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 14, (n,), generator=g)
    return [torch.randint(1, vocab - 1, (int(length),), generator=g) for length in lengths]


def test_random_qwen2_has_the_architecture_it_claims():
    for tied in (False, True):
        model = qwen2_target(tied=tied)
        assert type(model).__name__ == "Qwen2ForCausalLM"
        attn = model.model.layers[0].self_attn
        assert attn.q_proj.bias.abs().min() > 0 and attn.o_proj.bias is None
        assert model.config.rope_parameters["rope_theta"] == ROPE_BASE
        target = TargetModel(model)
        assert (target.lm_head_weight is target.model.get_input_embeddings().weight) == tied
    bad = TargetSpec(architecture="qwen2", hidden_size=64, num_attention_heads=4, head_dim=32)
    with pytest.raises(ValueError, match="head_dim"):
        random_target_config(bad)


def test_features_equal_hf_hidden_states():
    model = qwen2_target()
    target = TargetModel(model, layer_ids=[1, 3])
    ids = torch.randint(1, VOCAB - 1, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(input_ids=ids, output_hidden_states=True)
        out = target(ids)
    assert torch.equal(out.features, torch.cat([ref.hidden_states[2], ref.hidden_states[4]], dim=-1))
    assert torch.equal(out.logits, ref.logits)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_greedy_speculative_equals_hf_generate(tied):
    model = qwen2_target(tied=tied, head_scale=4.0)
    rows = random_prompts(4, seed=1)
    max_new = 12  # the oracle commits 8 tokens a step: 2 steps, proposals reach 16 tokens ahead
    refs = [hf_greedy(model, p, 16) for p in rows]
    want = [r[: len(p) + max_new].tolist() for r, p in zip(refs, rows)]
    random_out = speculative_generate(model, random_draft(vocab=VOCAB, block_size=10), rows,
                                      max_new_tokens=max_new, num_speculative_tokens=3)
    assert [s.tolist() for s in random_out.sequences] == want
    oracle_out = speculative_generate(model, GreedyOracle(model, 10, known=refs), rows, max_new_tokens=max_new,
                                      num_speculative_tokens=7)
    assert [s.tolist() for s in oracle_out.sequences] == want
    # The oracle is right about every slot: whole blocks commit, so the equality covers long runs.
    assert all(len(a) <= 2 for a in oracle_out.accepted), oracle_out.accepted


V = 16
R = 2000      # independent rows (one seed each) per configuration
STEPS = 3     # generated positions checked
ALPHA = 1e-4  # per check; fixed seeds make the outcome deterministic
PROMPT = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])


@functools.cache
def exact_marginals(temperature: float) -> list[torch.Tensor]:
    """Exact law of each of the first STEPS generated tokens, by enumerating all prefixes."""
    model = qwen2_target(vocab=V, head_scale=10.0)
    marg, weights = [], torch.ones(1, dtype=torch.float64)
    prefixes = torch.empty(1, 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(STEPS):
            seqs = torch.cat([PROMPT[None].expand(prefixes.shape[0], -1), prefixes], 1)
            full = weights[:, None] * torch.softmax(model(input_ids=seqs).logits[:, -1] / temperature, -1)
            marg.append(full.sum(0))
            prefixes = torch.cat([prefixes.repeat_interleave(V, 0),
                                  torch.arange(V).repeat(prefixes.shape[0])[:, None]], 1)
            weights = full.reshape(-1)
    return marg


def test_sampled_distribution_matches_target():
    """R rows of one prompt, one seed each: Pearson chi-square per generated position against
    the exact law (a random v2 draft: some slots accepted, most rejected, so both the accept
    and the residual paths decide tokens)."""
    temperature = 0.9
    model = qwen2_target(vocab=V, head_scale=10.0)
    out = speculative_generate(model, random_draft(vocab=V, top_k=4, std=0.3), PROMPT[None].expand(R, -1),
                               max_new_tokens=STEPS, num_speculative_tokens=3, temperature=temperature, seed=4321)
    gen = torch.stack([g[:STEPS] for g in out.generated])
    ps = [chi_square_pvalue(torch.bincount(gen[:, t], minlength=V), law)
          for t, law in enumerate(exact_marginals(temperature))]
    assert min(ps) > ALPHA, f"chi-square p-values {ps}"
    assert out.stats()["per_position_acceptance"][0] > 0.05  # accepted drafts decide some tokens


def test_exact_mode_speculative_equals_exact_ar_and_rows_alone():
    model = qwen2_target(head_scale=4.0)
    rows = random_prompts(2, seed=2)
    kw = dict(max_new_tokens=10, exact=True, exact_block_size=10)
    ar = speculative_generate(model, None, rows, **kw)
    plain = speculative_generate(model, None, rows, max_new_tokens=10)
    assert [s.tolist() for s in ar.sequences] == [s.tolist() for s in plain.sequences]
    refs = [s.tolist() for s in ar.sequences]
    oracle = OracleProposer(refs, seeds=[0, 1], block_size=10, accept_prob=0.9, vocab_size=VOCAB)
    spec = speculative_generate(model, oracle, rows, num_speculative_tokens=5, **kw)
    assert sum(map(sum, spec.accepted)) / sum(map(len, spec.accepted)) >= 1.0  # it really accepts
    assert [s.tolist() for s in spec.sequences] == refs
    alone_oracle = OracleProposer([refs[1]], seeds=[1], block_size=10, accept_prob=0.9, vocab_size=VOCAB)
    alone = speculative_generate(model, alone_oracle, [rows[1]], num_speculative_tokens=5, **kw)
    assert alone.sequences[0].tolist() == refs[1] and alone.accepted[0] == spec.accepted[1]


def _interpreter_or_skip() -> None:
    pytest.importorskip("triton")
    from dflash2.kernels.dispatch import triton_interpreter_enabled

    if not triton_interpreter_enabled():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")


def test_fused_small_m_linears_keep_the_qkv_biases(monkeypatch):
    """Exact mode's routing (`SmallMLinearMode`, every row count, q/k/v and gate/up fused) on a
    Qwen2 target: the fused q/k/v launch carries the three biases, and the logits equal the stock
    model's, where dropping the biases would move them by far more than the tolerance."""
    _interpreter_or_skip()
    import dflash2.kernels.linear as lin

    model = qwen2_target.__wrapped__().float()  # a fresh model: the cached one carries engine state
    no_bias = copy.deepcopy(model)
    for layer in no_bias.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.bias.data.zero_()
    ids = torch.stack(random_prompts(3, seed=4)[:1] * 2)[:, :6]     # 2 rows x 6 tokens = 12 rows
    launches = []
    real = lin._small_m_linear_triton
    monkeypatch.setattr(lin, "_small_m_linear_triton",
                        lambda x, w, b, *a: launches.append((isinstance(w, tuple) and len(w), b)) or real(x, w, b, *a))
    with torch.no_grad():
        ref, ref_no_bias = model(ids).logits, no_bias(ids).logits
        with lin.SmallMLinearMode("triton", "cpu", max_rows=None, fused=lin.fusable_groups(model)):
            out = model(ids).logits
    qkv = [b for width, b in launches if width == 3]
    assert len(qkv) == model.config.num_hidden_layers and all(b is not None and b.numel() == 64 + 2 * 32 for b in qkv)
    scale = ref.abs().max().item()
    assert (out - ref).abs().max().item() <= 1e-4 * scale
    assert (ref_no_bias - ref).abs().max().item() > 1e-2 * scale  # the check would see a dropped bias


def test_invariant_exact_mode_on_a_qwen2_target():
    """The `invariant` path (the H200's exact mode) under Triton's interpreter, end to end on a
    Qwen2 target: the exact AR output equals transformers' greedy one, each row alone equals its
    batch row, and an accepting speculative run equals the exact AR run."""
    _interpreter_or_skip()
    model = qwen2_target.__wrapped__(head_scale=4.0).float()  # fresh, as above
    rows = random_prompts(2, seed=3)
    kw = dict(max_new_tokens=5, exact=True, exact_block_size=8, exact_impl="invariant")
    ar = speculative_generate(model, None, rows, **kw)
    assert [s.tolist() for s in ar.sequences] == [hf_greedy(model, p, 5).tolist() for p in rows]
    alone = speculative_generate(model, None, [rows[1]], **kw)
    assert alone.sequences[0].tolist() == ar.sequences[1].tolist()
    refs = [s.tolist() for s in ar.sequences]
    oracle = OracleProposer(refs, seeds=[0, 1], block_size=8, accept_prob=0.9, vocab_size=VOCAB)
    spec = speculative_generate(model, oracle, rows, num_speculative_tokens=3, **kw)
    assert sum(map(sum, spec.accepted)) / sum(map(len, spec.accepted)) >= 1.0  # it really accepts
    assert [s.tolist() for s in spec.sequences] == refs


def test_new_draft_mirrors_a_qwen2_target():
    """Qwen2's config has no head_dim attribute: the drafter derives it; the RoPE base is copied."""
    target = TargetModel(copy.deepcopy(qwen2_target()).float())
    draft = new_draft(DraftSpec(num_hidden_layers=1, block_size=8, selector_rank=8, selector_top_k=4), target,
                      seed=0)
    cfg = draft.config
    assert (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 16, 4, 2)
    assert cfg.rope_parameters["rope_theta"] == ROPE_BASE
    target.check_compatible(cfg)


def test_distillation_on_a_qwen2_target_lowers_the_loss(tmp_path):
    """Untied head, as the 1.5B (the tied head's shared tensor is covered by the greedy test)."""
    tied = False
    from dflash2.runconfig import prepare_output_dir
    from dflash2.training.metrics import read_metrics
    from dflash2.training.trainer import Distiller
    from tests.training.distill_helpers import synthetic_data, tiny_config

    cfg = tiny_config(tmp_path / "run", max_steps=8, checkpoint_every=100, eval_max_new_tokens=0)
    cfg.target = qwen2_spec(tied=tied)
    target = TargetModel(copy.deepcopy(qwen2_target(tied=tied)).float()).requires_grad_(False)
    prepare_output_dir(tmp_path / "run", False)
    torch.manual_seed(0)
    final = Distiller(cfg, target, None, synthetic_data(), tmp_path / "run").fit()
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 9))
    first, last = sum(r["loss"] for r in rows[:3]) / 3, sum(r["loss"] for r in rows[-3:]) / 3
    assert last < first - 0.1, (first, last)
    assert (final / "config.json").is_file()
