"""GPU: tree verify (`verify="tree"`) on CUDA with the Triton kernels (expansion, mask, verify).

- graph path == eager path token for token (fp32, greedy and sampled, a DFlash2 draft with its
  selector edges and the device oracle that accepts), every replay under `sync_check` (no host
  synchronization in the captured tree step), replays counted;
- greedy tree output == AR (fp32), with tokens accepted off the chain;
- exact mode (invariant kernels, bf16): tree output bit for bit exact AR's at T = 0 and T = 1,
  graph-captured;
- step time of tree budgets against the chain, written to DFLASH2_GPU_OUT/tree.json.

Run on the device:  python -m pytest -m gpu tests/gpu/test_tree.py -s
"""

from __future__ import annotations

import time

import pytest
import torch

from dflash2 import speculative_generate
from dflash2.engine.graphs import sync_check
from dflash2.engine.kept import release_decode_state
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer
from tests.gpu.helpers import cuda_models_then_write, mean_accepted

pytestmark = pytest.mark.gpu

VOCAB = 151936
SEEDS = [11, 12, 13, 14]
RESULTS: dict = {}


@pytest.fixture(scope="module")
def models():
    yield from cuda_models_then_write(VOCAB, "tree.json", RESULTS)


def _oracle(prompts, ar, accept_prob=0.6):
    refs = [p.tolist() + g.tolist() for p, g in zip(prompts, ar.generated)]
    return DeviceOracleProposer(refs, SEEDS, block_size=16, accept_prob=accept_prob, vocab_size=VOCAB, device="cuda")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["dflash2", "oracle"])
def test_tree_graph_path_equals_eager_path(models, kind, temperature):
    target, draft, prompts = models
    ar = speculative_generate(target, None, prompts, max_new_tokens=80, temperature=temperature, seed=SEEDS,
                              graphs=False)
    drafter = draft if kind == "dflash2" else _oracle(prompts, ar)
    kw = dict(max_new_tokens=80, num_speculative_tokens=7, temperature=temperature, seed=SEEDS, verify="tree",
              tree_budget=32)
    eager = speculative_generate(target, drafter, prompts, graphs=False, **kw)
    release_decode_state(target)
    with sync_check(True):
        graphed = speculative_generate(target, drafter, prompts, graphs=True, **kw)
    assert [s.tolist() for s in graphed.sequences] == [s.tolist() for s in eager.sequences]
    assert graphed.accepted == eager.accepted
    t = graphed.times
    assert t.graph_captures >= 1 and t.graph_replays == len(t.verify) - t.graph_captures > 0
    if kind == "oracle":
        assert [s.tolist() for s in eager.sequences] == [s.tolist() for s in ar.sequences]  # draw for draw
        if temperature == 0.0:
            chain = speculative_generate(target, drafter, prompts, **{**kw, "verify": "chain", "tree_budget": None})
            assert mean_accepted(eager) > mean_accepted(chain)  # right siblings accepted off the chain
            RESULTS["oracle_mean_accepted"] = {"tree32": mean_accepted(eager), "chain": mean_accepted(chain)}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_exact_tree_is_exact_ar_in_bf16(models, temperature):
    target, _, prompts = models
    target = target.to(torch.bfloat16)
    try:
        kw = dict(max_new_tokens=64, temperature=temperature, seed=SEEDS, exact=True, exact_impl="invariant",
                  exact_block_size=16)
        ar = speculative_generate(target, None, prompts, **kw)
        oracle = _oracle(prompts, ar)
        tree = speculative_generate(target, oracle, prompts, num_speculative_tokens=7, verify="tree", tree_budget=32,
                                    graphs=True, **kw)
        assert [s.tolist() for s in tree.sequences] == [s.tolist() for s in ar.sequences]
        assert mean_accepted(tree) > 1.0 and tree.times.graph_replays > 0
    finally:
        target.float()
        release_decode_state(target)


def test_tree_step_time(models):
    """Per-step wall time (graphs, greedy, the oracle) of the chain at N = 7 and trees of 16/32/64
    nodes at N = 7 and 15: what a node costs beside the chain's N + 1 rows."""
    target, _, prompts = models
    ar = speculative_generate(target, None, prompts, max_new_tokens=200, graphs=False)
    oracle = _oracle(prompts, ar)
    runs = {"chain_N7": dict(num_speculative_tokens=7)}
    for n in (7, 15):
        for b in (16, 32, 64):
            runs[f"tree{b}_N{n}"] = dict(num_speculative_tokens=n, verify="tree", tree_budget=b)
    for name, kw in runs.items():
        speculative_generate(target, oracle, prompts, max_new_tokens=40, **kw)  # capture
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = speculative_generate(target, oracle, prompts, max_new_tokens=200, **kw)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        steps = max(map(len, out.accepted))
        RESULTS[name] = {"ms_per_step": 1e3 * wall / steps, "mean_accepted": mean_accepted(out)}
    print(RESULTS)
