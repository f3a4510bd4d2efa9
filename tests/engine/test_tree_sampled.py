"""`verify="tree"` at T > 0 and in exact mode.

- sampled tree output passes the chi-square tests of `test_sampling.py` against the target's
  exact law, with a proposer whose slots are mostly accepted (the test is not vacuous);
- every committed token is the target's own keyed draw at its position, so sampled tree output
  equals the AR loop's sampled output for the same seeds (fp32 target: the tree forward's and
  AR's logits agree to rounding, which no draw here is near), with an oracle whose drafts really
  get accepted, on and off the chain;
- the graph path (CPU stand-in) equals the eager loop, kept state included;
- exact mode: tree output is bit for bit exact AR's at T = 0 and T = 1, with the oracle and with
  a DFlash2 draft (its selector's edges), the path confirmed by the exact chain forward.
"""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer, OracleProposer
from tests.engine.helpers import fp32_target_draft_prompts, qwen3_target
from tests.engine.test_adaptive_verify import SharedPrefixOracle
from tests.engine.test_graph_step import fake_graphs  # noqa: F401 (fixture)
from tests.engine.test_sampling import ALPHA, PROMPT, R, STEPS, pvalues, small_target

BLOCK, MAX_NEW, VOCAB = 8, 20, 300
SEEDS = [11, 12, 13]


def test_sampled_tree_follows_the_target_law():
    temperature, top_k = 0.8, 5
    oracle = SharedPrefixOracle(small_target(), BLOCK, temperature, k=2, seed=1)
    out = speculative_generate(small_target(), oracle, PROMPT[None].expand(R, -1), max_new_tokens=STEPS,
                               num_speculative_tokens=3, temperature=temperature, top_k=top_k, seed=1234,
                               verify="tree", tree_budget=8)
    ps = pvalues(out, temperature, top_k=top_k)
    assert min(ps) > ALPHA, f"chi-square p-values {ps}"
    assert out.stats()["per_position_acceptance"][0] > 0.5  # most first slots accepted: not vacuous


@pytest.fixture(scope="module")
def setup():
    target = qwen3_target(vocab=VOCAB, head_scale=4.0)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, VOCAB, (n,), generator=g) for n in (5, 17, 9)]
    return target, rows


def _oracle(ref, accept_prob=0.5):
    """Candidates [right, wrong] per slot (right = the reference's token), the drafted one right
    with `accept_prob`: a tree of enough nodes holds the right sibling where the chain breaks."""
    return OracleProposer([s.tolist() for s in ref.sequences], seeds=[3, 4, 5], block_size=BLOCK,
                          accept_prob=accept_prob, vocab_size=VOCAB)


@pytest.mark.parametrize("exact", [False, True], ids=["normal", "exact"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_equals_ar_draw_for_draw(setup, temperature, exact):
    target, rows = setup
    kw = dict(max_new_tokens=MAX_NEW, temperature=temperature, seed=SEEDS, exact=exact, exact_block_size=BLOCK)
    ar = speculative_generate(target, None, rows, **kw)
    oracle = _oracle(ar)
    tree = speculative_generate(target, oracle, rows, num_speculative_tokens=5, verify="tree", tree_budget=16, **kw)
    chain = speculative_generate(target, oracle, rows, num_speculative_tokens=5, **kw)
    for a, b in zip(tree.sequences, ar.sequences, strict=True):
        assert torch.equal(a, b)
    got, base = sum(map(sum, tree.accepted)), sum(map(sum, chain.accepted))
    assert got > base and got >= len(rows) * 6  # right siblings accepted off the chain


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_exact_tree_with_a_dflash2_draft_is_exact_ar(temperature):
    target, draft, rows = fp32_target_draft_prompts(VOCAB, layers=4)
    kw = dict(max_new_tokens=12, temperature=temperature, seed=SEEDS, exact=True, exact_block_size=8)
    ar = speculative_generate(target, None, rows, **kw)
    out = speculative_generate(target, draft, rows, num_speculative_tokens=4, verify="tree", tree_budget=12, **kw)
    for a, b in zip(out.sequences, ar.sequences, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_graph_path_equals_the_eager_loop(fake_graphs, temperature):  # noqa: F811
    """The graph path's bookkeeping (CPU stand-in that replays by running the captured body, K/V
    buckets of 8 slots): a kept state with tree buffers, several buckets, the same output."""
    target = qwen3_target(vocab=VOCAB, head_scale=4.0)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, VOCAB, (n,), generator=g) for n in (7, 4, 13)]
    ar = speculative_generate(target, None, rows, max_new_tokens=16, temperature=temperature, seed=SEEDS)
    oracle = DeviceOracleProposer([s.tolist() for s in ar.sequences], SEEDS, block_size=BLOCK, accept_prob=0.5,
                                  vocab_size=VOCAB, device="cpu")
    kw = dict(max_new_tokens=16, num_speculative_tokens=5, temperature=temperature, seed=SEEDS, verify="tree",
              tree_budget=12)
    eager = speculative_generate(target, oracle, rows, graphs=False, **kw)
    graphed = speculative_generate(target, oracle, rows, graphs=True, **kw)
    again = speculative_generate(target, oracle, rows, graphs=True, **kw)  # the kept state, reloaded
    assert fake_graphs[-1].replays > 0
    for out in (graphed, again):
        assert [s.tolist() for s in out.sequences] == [s.tolist() for s in eager.sequences]
        assert out.accepted == eager.accepted
    assert [s.tolist() for s in eager.sequences] == [s.tolist() for s in ar.sequences]
    assert sum(map(sum, eager.accepted)) >= 12
