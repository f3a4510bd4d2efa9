"""`verify="tree"`, greedy (sampled and exact mode: test_tree_sampled.py): greedy tree output
equals AR token for token, with proposers that really get tokens accepted, and the tree accepts
at least what the chain does."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.engine.inputs import GenerateInputError
from dflash2.evaluation.arms.oracle_proposers import OracleProposer
from tests.engine.helpers import fp32_target_draft_prompts, qwen3_target

BLOCK, MAX_NEW, VOCAB = 8, 20, 300


@pytest.fixture(scope="module")
def setup():
    target = qwen3_target(vocab=VOCAB, head_scale=4.0)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, VOCAB, (n,), generator=g) for n in (5, 17, 9)]
    ar = speculative_generate(target, None, rows, max_new_tokens=MAX_NEW)
    return target, rows, ar


def _oracle(ar, accept_prob):
    """Candidates [right, wrong] per slot, the drafted one right with `accept_prob`: the chain
    breaks at its first wrong token, while a tree of enough nodes also holds the right sibling."""
    return OracleProposer([s.tolist() for s in ar.sequences], seeds=[3, 4, 5], block_size=BLOCK,
                          accept_prob=accept_prob, vocab_size=VOCAB)


@pytest.mark.parametrize("n_spec,budget", [(3, 4), (3, 9), (5, 16), (5, 3)])
def test_greedy_tree_equals_ar(setup, n_spec, budget):
    target, rows, ar = setup
    oracle = _oracle(ar, 0.5)
    tree = speculative_generate(target, oracle, rows, max_new_tokens=MAX_NEW, num_speculative_tokens=n_spec,
                                verify="tree", tree_budget=budget)
    chain = speculative_generate(target, oracle, rows, max_new_tokens=MAX_NEW, num_speculative_tokens=n_spec)
    for a, b in zip(tree.sequences, ar.sequences, strict=True):
        assert torch.equal(a, b)
    got, base = sum(map(sum, tree.accepted)), sum(map(sum, chain.accepted))
    assert all(a <= min(n_spec, budget - 1) for acc in tree.accepted for a in acc)
    if budget == n_spec + 1:  # the tree is the chain: the same steps
        assert tree.accepted == chain.accepted
    elif budget > n_spec + 1:  # right siblings in the tree: more accepted per step than the chain
        assert got > base and got >= len(rows) * 6
    assert all(set(v) == {n_spec} for v in tree.verify_lengths)


def test_greedy_tree_with_a_dflash2_draft_equals_ar():
    """The DFlash2 proposer's own selector edges (`Proposal.edges`) and context features."""
    target, draft, rows = fp32_target_draft_prompts(VOCAB, layers=4)
    ar = speculative_generate(target, None, rows, max_new_tokens=12)
    out = speculative_generate(target, draft, rows, max_new_tokens=12, num_speculative_tokens=4, verify="tree",
                               tree_budget=12)
    for a, b in zip(out.sequences, ar.sequences, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kw,match", [
    (dict(verify="tree"), r"^tree_budget: is None"),
    (dict(verify="tree", tree_budget=0), r"^tree_budget: "),
    (dict(verify="tree", tree_budget=65), r"^tree_budget: "),
    (dict(verify="chain", tree_budget=4), r"^tree_budget: is 4 but verify is 'chain'"),
    (dict(verify="tree", tree_budget=4, graphs=True), r"^graphs: is True but the target is on cpu"),
])
def test_tree_arguments_are_checked(setup, kw, match):
    target, rows, ar = setup
    with pytest.raises(GenerateInputError, match=match):
        speculative_generate(target, _oracle(ar, 0.5), rows, max_new_tokens=2, num_speculative_tokens=3, **kw)


class _ContextRecorder(OracleProposer):
    """The oracle, asking for target features, recording the context each step hands it (the
    features of the tokens committed by the step before: the root and the accepted tree path)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.target_layer_ids = [0, 2]
        self.seen = []

    def propose(self, step):
        self.seen.append((step.context.clone(), step.context_positions.clone(), step.context_counts.clone()))
        return super().propose(step)


def test_tree_commits_the_accepted_paths_features(setup):
    """The next step's context holds, at every committed position, the target's own features of
    the AR sequence there (a full forward without cache): the path's nodes were gathered, and the
    K/V they attended to (moved from node slots to position slots) were the right ones."""
    from dflash2.engine.inputs import as_target

    target, rows, ar = setup
    rec = _ContextRecorder([s.tolist() for s in ar.sequences], seeds=[3, 4, 5], block_size=BLOCK, accept_prob=0.5,
                           vocab_size=VOCAB)
    out = speculative_generate(target, rec, rows, max_new_tokens=MAX_NEW, num_speculative_tokens=4, verify="tree",
                               tree_budget=14)
    assert sum(map(sum, out.accepted)) >= 12
    tgt = as_target(target)
    full = [tgt(s[None], position_ids=torch.arange(s.numel())[None], layer_ids=[0, 2]).features[0]
            for s in ar.sequences]
    checked = 0
    for feats, pos, counts in rec.seen:
        for b in range(len(rows)):
            for i in range(int(counts[b])):
                p = int(pos[b, i])
                if p < full[b].shape[0]:
                    torch.testing.assert_close(feats[b, i], full[b][p], rtol=1e-9, atol=1e-9)
                    checked += 1
    # every step but the last hands its acc + 1 committed tokens' features to the next
    assert checked == sum(len(a) - 1 + sum(a[:-1]) for a in out.accepted)
