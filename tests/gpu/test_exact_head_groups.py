"""GPU proof of exact mode where the row-attention kernel splits a K/V head's query heads over
programs (head groups): the Qwen2.5-0.5B attention layout (14 query / 2 K/V heads, head dim 64)
at a block-16 drafter's width, where one K/V head's 7 query heads x 16 queries = 112 tile rows do
not fit one 64-row tile. bf16, the full Qwen2.5-Coder-0.5B-Instruct shape (24 layers, hidden
896, tied embeddings), random weights with a sharpened head so logits are peaked.

- `exact_impl="auto"` resolves to the invariant kernels at width 16 (not the row-by-row fallback);
- exact AR: each batch-8 row == the same prompt alone;
- exact speculative == exact AR at batch 8 for N = 7 and 15 (host oracle, eager step) and N = 15
  with the device oracle (graph-replayed step); each prompt alone at N = 15 == its batch row;
  every proposer accepts >= 1 draft token per step on average, so the equalities are not trivial;
- the control (`exact=False`, same oracle) is recorded; it is asserted in its own test.

Run on the device:  python -m pytest -m gpu tests/gpu/test_exact_head_groups.py -s
With DFLASH2_GPU_OUT=DIR it writes DIR/exact_head_groups.json (acceptance, departures, wall times).
"""

from __future__ import annotations

import time

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer, OracleProposer
from tests.gpu.helpers import departures, mean_accepted, write_results

pytestmark = pytest.mark.gpu

PROMPTS, PROMPT_LEN, NEW, WIDTH, VOCAB, HEAD_SCALE = 8, 64, 128, 16, 151936, 3.0
RESULTS: dict = {}


@pytest.fixture(scope="module")
def target():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dflash2.target import TargetModel

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(HEAD_SCALE)  # tied: the embeddings scale too
    yield TargetModel(model)
    write_results("exact_head_groups.json", RESULTS)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (PROMPT_LEN + 7 * i,), generator=g) for i in range(PROMPTS)]


def _run(target, draft, rows, n_spec=0, exact=True):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    kw = dict(exact=True, exact_block_size=WIDTH, exact_impl="auto") if exact else {}
    out = speculative_generate(target, draft, rows, max_new_tokens=NEW, num_speculative_tokens=n_spec, **kw)
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


@pytest.fixture(scope="module")
def ar_runs(target, prompts):
    alone = [_run(target, None, [p]) for p in prompts]
    batch, t_batch = _run(target, None, prompts)
    RESULTS["ar_wall_s"] = {"batch1_total": sum(t for _, t in alone), "batch8": t_batch}
    return [o for o, _ in alone], batch


def test_auto_resolves_to_the_invariant_kernels_at_width_16(target):
    from dflash2.engine.inputs import resolve_exact_impl

    assert resolve_exact_impl("auto", True, target, WIDTH) == "invariant"


def test_exact_ar_batch_rows_equal_alone(ar_runs):
    alone, batch = ar_runs
    for b, o in enumerate(alone):
        assert torch.equal(o.sequences[0], batch.sequences[b]), f"row {b}"


@pytest.mark.parametrize("n_spec", [7, 15])
def test_exact_speculative_equals_exact_ar(target, prompts, ar_runs, n_spec):
    alone_ar, batch_ar = ar_runs
    refs = [r.tolist() for r in batch_ar.sequences]
    oracle = OracleProposer(refs, seeds=list(range(PROMPTS)), block_size=WIDTH, accept_prob=0.9, vocab_size=VOCAB)
    batch, t_batch = _run(target, oracle, prompts, n_spec)
    acc = mean_accepted(batch)
    RESULTS[f"N{n_spec}"] = {"mean_accepted": acc, "wall_s_batch8": t_batch, "departures": departures(batch, batch_ar)}
    assert acc >= 1.0, f"oracle accepted {acc:.2f} per step: the equality would be trivial"
    assert departures(batch, batch_ar) == [-1] * PROMPTS
    if n_spec == 15:
        for b, p in enumerate(prompts):
            one = OracleProposer([refs[b]], seeds=[b], block_size=WIDTH, accept_prob=0.9, vocab_size=VOCAB)
            alone, _ = _run(target, one, [p], n_spec)
            assert torch.equal(alone.sequences[0], batch.sequences[b]), f"row {b}: batch 8 != alone"
            assert torch.equal(alone.sequences[0], alone_ar[b].sequences[0]), f"row {b}: alone spec != AR"


def test_graph_replayed_speculative_equals_exact_ar(target, prompts, ar_runs):
    refs = [r.tolist() for r in ar_runs[1].sequences]
    oracle = DeviceOracleProposer(refs, list(range(PROMPTS)), block_size=WIDTH, accept_prob=0.9,
                                  vocab_size=VOCAB, device="cuda")
    out, t = _run(target, oracle, prompts, 15)
    RESULTS["N15_graph"] = {"mean_accepted": mean_accepted(out), "wall_s_batch8": t,
                            "replayed": any(out.times.replayed), "graph_error": out.times.graph_error}
    assert mean_accepted(out) >= 1.0
    assert out.times.graph_error is None and any(out.times.replayed), "the step did not replay"
    assert departures(out, ar_runs[1]) == [-1] * PROMPTS


def test_normal_mode_departs_in_bf16(target, prompts):
    """The control: the same oracle without exact mode (the default engine) leaves the AR output
    at some bf16 near-tie; else the equalities above prove nothing about this layout's numerics."""
    ar, _ = _run(target, None, prompts, exact=False)
    refs = [r.tolist() for r in ar.sequences]
    dep = []
    for n_spec in (7, 15):
        oracle = OracleProposer(refs, seeds=list(range(PROMPTS)), block_size=WIDTH, accept_prob=0.9, vocab_size=VOCAB)
        spec, _ = _run(target, oracle, prompts, n_spec, exact=False)
        dep += departures(spec, ar)
    RESULTS["control_departures_N7_N15"] = dep
    assert any(d >= 0 for d in dep), "no departure without exact mode: the control shows nothing"
