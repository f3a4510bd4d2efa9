"""Token-tree expansion: the Triton kernel against the PyTorch reference (every node array, bit
for bit), on random edges, edges full of ties, trees smaller than the budget (padding), no slots."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine.tree import ancestor_matrix, expand_tree, greedy_chain
from dflash2.kernels.tree_expand import expand_nodes, expand_reference
from dflash2.kernels.tree_mask import tree_ancestors

NAMES = ("tokens", "parent", "depth", "cand", "score", "valid", "on_chain")


def _case(bsz: int, n: int, k: int, ties: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    edges = torch.randn(bsz, n, k, k, generator=g)
    if ties:  # few distinct values: equal path scores, so the tie-breaking rule decides
        edges = edges.round()
    if n:
        edges[:, 0] = edges[:, 0, :1]  # slot 0: one row for every predecessor (the anchor's)
    cand = torch.rand(bsz * n, 200, generator=g).argsort(-1)[:, :k].reshape(bsz, n, k)  # distinct per slot
    anchor = torch.randint(0, 200, (bsz,), generator=g)
    chain = greedy_chain(edges) if seed % 2 else torch.randint(0, k, (bsz, n), generator=g)
    return torch.log_softmax(edges, -1), cand, anchor, chain


@pytest.mark.parametrize("bsz,n,k,budget,ties", [
    (3, 4, 3, 12, False), (2, 6, 2, 16, True), (2, 3, 2, 40, False),  # 40 > the 15-node full tree: padding
    (1, 1, 4, 9, True), (2, 0, 3, 5, False), (4, 5, 4, 1, False), (2, 7, 8, 64, True)])
def test_triton_expansion_matches_the_reference(triton_device, bsz, n, k, budget, ties) -> None:
    logp, cand, anchor, chain = _case(bsz, n, k, ties, seed=bsz * 100 + n * 10 + k + budget)
    ref = expand_reference(logp, cand, anchor, budget, chain)
    dev = triton_device
    out = expand_nodes(logp.to(dev), cand.to(dev), anchor.to(dev), budget, chain.to(dev), impl="triton")
    for name, r, o in zip(NAMES, ref, out, strict=True):
        assert o.dtype == r.dtype and o.shape == (bsz, budget), name
        assert torch.equal(o.cpu(), r), name
    assert bool(ref[5][:, : min(budget, 1 + n)].all())  # the chain (and root) always fit


def test_expand_tree_dispatch_is_the_same_tree(triton_device) -> None:
    logp, cand, anchor, chain = _case(2, 5, 3, False, seed=7)
    edges = logp.exp()  # any scores: expand_tree takes their log-softmax again
    a = expand_tree(edges, cand, anchor, 10, chain, impl="torch")
    b = expand_tree(edges.to(triton_device), cand.to(triton_device), anchor.to(triton_device), 10,
                    chain.to(triton_device), impl="triton")
    for name in NAMES:  # (the log-softmax itself ran on two devices: scores to rounding)
        if name == "score":
            torch.testing.assert_close(a.score, b.score.cpu())
        else:
            assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name
    with pytest.raises(ValueError, match="resolved"):
        expand_nodes(logp, cand, anchor, 4, chain, impl="auto")


@pytest.mark.parametrize("budget", [1, 2, 7, 33])
def test_ancestor_matrix_is_tree_ancestors(budget) -> None:
    logp, cand, anchor, chain = _case(3, 6, 3, True, seed=budget)
    parent = expand_reference(logp, cand, anchor, budget, chain)[1]
    assert torch.equal(ancestor_matrix(parent), tree_ancestors(parent))
    deep = torch.tensor([[-1] + list(range(budget - 1))])  # a chain: every earlier node is an ancestor
    assert torch.equal(ancestor_matrix(deep)[0], torch.ones(budget, budget, dtype=torch.bool).tril())
