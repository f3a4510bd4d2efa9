"""Tree verify, stage 1: the expansion rule (`dflash2.engine.tree`) against brute force, the
chain-subset guarantee against the selector walk, and greedy tree acceptance."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dflash2.kernels.dispatch import triton_interpreter_enabled
from dflash2.engine.tree import build_tree, expand_tree, greedy_chain, tree_edge_scores
from dflash2.kernels.selector import selector_walk


def _problem(bsz, n, k, rank=4, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    unary = torch.randn(bsz, n, k, generator=g) * 2
    cand = torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(bsz * n)]).view(bsz, n, k)
    eta = torch.randn(bsz, n, rank, generator=g)
    a = torch.randn(vocab, rank, generator=g)
    z = torch.randn(vocab, rank, generator=g)
    anchor = torch.randint(0, vocab, (bsz,), generator=g)
    return unary, cand, eta, a, z, anchor


def _walk(problem, temperature=0.0, impl="torch"):
    unary, cand, eta, a, z, anchor = problem
    bsz = unary.shape[0]
    temp = torch.full((bsz,), float(temperature))
    seeds = torch.arange(bsz, dtype=torch.long) * 7919 + 3
    pos = torch.arange(bsz, dtype=torch.long) + 100
    return selector_walk(unary, cand, eta, a, z, anchor, temp, seeds, pos, impl=impl)


def _all_paths(problem, b):
    """Every node of the full k-ary tree of depth N for request b: {cand-index path: (score, tokens)},
    scores summed in fp64 from per-edge explicit sums (independent of the module's batching)."""
    unary, cand, eta, a, z, anchor = (t.double() if t.is_floating_point() else t for t in problem)
    n, k = unary.shape[1:]
    out = {(): (0.0, ())}
    for d in range(1, n + 1):
        for path in itertools.product(range(k), repeat=d):
            prev_score, prev_tokens = out[path[:-1]]
            pred = int(anchor[b]) if d == 1 else prev_tokens[-1]
            j = d - 1
            row = [float(unary[b, j, c]) + sum(float(a[pred, r] * eta[b, j, r] * z[cand[b, j, c], r])
                                              for r in range(eta.shape[-1])) for c in range(k)]
            lse = math.log(sum(math.exp(x) for x in row))
            out[path] = (prev_score + row[path[-1]] - lse, prev_tokens + (int(cand[b, j, path[-1]]),))
    return out


def _node_paths(tree, b):
    """Candidate-index root path of every valid node of request b."""
    paths = []
    for i in range(tree.tokens.shape[1]):
        if not tree.valid[b, i]:
            paths.append(None)
            continue
        p, node = [], i
        while node > 0:
            p.append(int(tree.cand[b, node]))
            node = int(tree.parent[b, node])
        paths.append(tuple(reversed(p)))
    return paths


def _check_structure(tree, cand, anchor):
    bsz, budget = tree.tokens.shape
    for b in range(bsz):
        assert tree.parent[b, 0] == -1 and tree.depth[b, 0] == 0 and tree.tokens[b, 0] == anchor[b]
        seen_pad = False
        for i in range(1, budget):
            if not tree.valid[b, i]:
                seen_pad = True
                assert tree.parent[b, i] == -1 and tree.depth[b, i] == 0 and tree.tokens[b, i] == anchor[b]
                continue
            assert not seen_pad, "padding only at the end"
            par = int(tree.parent[b, i])
            assert 0 <= par < i and tree.valid[b, par]
            d = int(tree.depth[b, i])
            assert d == tree.depth[b, par] + 1
            assert tree.tokens[b, i] == cand[b, d - 1, tree.cand[b, i]]


@pytest.mark.parametrize("bsz,n,k,budget", [(3, 3, 3, 9), (2, 4, 2, 12), (2, 3, 4, 4), (1, 2, 3, 13)])
def test_expansion_matches_brute_force(bsz, n, k, budget) -> None:
    problem = _problem(bsz, n, k, seed=bsz * 100 + n * 10 + k)
    unary, cand, eta, a, z, anchor = problem
    tree = build_tree(*problem, budget=budget)
    _check_structure(tree, cand, anchor)
    chosen = _walk(problem)[1]
    for b in range(bsz):
        allp = _all_paths(problem, b)
        paths = _node_paths(tree, b)
        got = [p for p in paths if p is not None]
        assert len(got) == len(set(got)) == min(budget, len(allp))
        chain = tuple(int(c) for c in chosen[b])
        n_chain = min(n, budget - 1)
        assert got[:n_chain + 1] == [chain[:d] for d in range(n_chain + 1)]  # root + chain, depth order
        for i, p in enumerate(got):
            assert tree.score[b, i].item() == pytest.approx(allp[p][0], abs=1e-4)
            assert tree.tokens[b, i].item() == (allp[p][1][-1] if p else int(anchor[b]))
        # the rest: the highest path scores among the non-chain nodes, in non-increasing order
        rest = sorted((s for p, (s, _) in allp.items() if p not in got[:n_chain + 1]), reverse=True)
        taken = [allp[p][0] for p in got[n_chain + 1:]]
        assert taken == pytest.approx(rest[:len(taken)], abs=1e-4)
        assert all(x >= y - 1e-6 for x, y in zip(taken, taken[1:]))


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")  # masked-off lanes
def test_chain_is_in_the_tree(impl) -> None:
    if impl == "triton":
        pytest.importorskip("triton")
        if not triton_interpreter_enabled():  # CPU tensors here
            pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")
    problem = _problem(6, 5, 4, rank=8, vocab=80, seed=7)
    tokens, chosen, _ = _walk(problem, impl=impl)
    edges = tree_edge_scores(*problem)
    assert torch.equal(greedy_chain(edges), chosen)
    for budget in (6, 7, 11, 20):  # B >= N + 1: the whole chain, as nodes 1..N
        tree = build_tree(*problem, budget=budget)
        assert torch.equal(tree.tokens[:, 1:6], tokens)
        assert tree.on_chain[:, :6].all() and not tree.on_chain[:, 6:].any()
    tree = build_tree(*problem, budget=3)  # B < N + 1: a prefix of the chain
    assert torch.equal(tree.tokens[:, 1:], tokens[:, :2]) and tree.on_chain.all()


def test_given_chain_is_kept() -> None:
    """A sampled walk's path (not the greedy one) is the chain when passed as `chain=`."""
    problem = _problem(4, 4, 3, seed=11)
    tokens, chosen, _ = _walk(problem, temperature=1.5)
    assert not torch.equal(chosen, _walk(problem)[1])  # the seeds make it differ somewhere
    tree = build_tree(*problem, budget=9, chain=chosen)
    assert torch.equal(tree.tokens[:, 1:5], tokens) and torch.equal(tree.cand[:, 1:5], chosen)
    _check_structure(tree, problem[1], problem[5])


def test_tie_break_and_padding() -> None:
    """Flat scores (Z = 0, equal unaries): the chain is candidate 0 at every slot; then the best
    path scores are the depth-1 siblings in candidate order, then the depth-2 nodes by frontier
    index (earlier-taken parent first: chain node 1's, then node 4's), before any depth 3."""
    n, k = 3, 3
    unary = torch.zeros(1, n, k)
    cand = torch.arange(n * k).view(1, n, k) + 10
    eta, a, z = torch.ones(1, n, 2), torch.ones(40, 2), torch.zeros(40, 2)
    anchor = torch.tensor([5])
    tree = build_tree(unary, cand, eta, a, z, anchor, budget=9)
    assert tree.tokens[0].tolist() == [5, 10, 13, 16, 11, 12, 14, 15, 13]
    assert tree.parent[0].tolist() == [-1, 0, 1, 2, 0, 0, 1, 1, 4]
    assert tree.depth[0].tolist() == [0, 1, 2, 3, 1, 1, 2, 2, 2]
    # k = 1: the whole tree is the chain of N + 1 nodes; the rest is padding
    tree = build_tree(unary[..., :1], cand[..., :1], eta, a, z, anchor, budget=6)
    assert tree.valid[0].tolist() == [True] * 4 + [False] * 2
    assert tree.parent[0].tolist() == [-1, 0, 1, 2, -1, -1] and tree.tokens[0, 4:].tolist() == [5, 5]
    assert torch.isneginf(tree.score[0, 4:]).all()
    # N = 0: the root alone, then padding
    tree = expand_tree(torch.zeros(1, 0, 2, 2), torch.zeros(1, 0, 2, dtype=torch.long), anchor, 3)
    assert tree.valid[0].tolist() == [True, False, False]


def test_rows_are_independent() -> None:
    problem = _problem(5, 4, 3, seed=3)
    tree = build_tree(*problem, budget=10)
    for b in range(5):
        one = build_tree(*(t[b:b + 1] if t.shape[0] == 5 else t for t in problem), budget=10)
        for name in ("tokens", "parent", "depth", "cand", "valid", "on_chain"):
            assert torch.equal(getattr(one, name)[0], getattr(tree, name)[b]), name
        assert torch.allclose(one.score[0], tree.score[b])


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="budget"):
        build_tree(*_problem(1, 2, 2), budget=0)


def _hand_tree():
    """root(5) -> a(10) -> b(11) -> c(12); a -> d(13); root -> e(14) -> f(15); one padding node."""
    from dflash2.engine.tree import TokenTree

    tokens = torch.tensor([[5, 10, 11, 12, 14, 13, 15, 5]])
    parent = torch.tensor([[-1, 0, 1, 2, 0, 1, 4, -1]])
    depth = torch.tensor([[0, 1, 2, 3, 1, 2, 2, 0]])
    valid = torch.tensor([[True] * 7 + [False]])
    zeros = torch.zeros_like(tokens)
    return TokenTree(tokens, parent, depth, zeros, zeros.float(), valid, valid)


@pytest.mark.parametrize("argmax,accepted,path,bonus", [
    # target after: root, a, b, c, e, d, f, pad
    ([10, 11, 12, 99, 98, 97, 96, 95], 3, [1, 2, 3], 99),  # the whole left branch, bonus at c
    ([10, 13, 77, 99, 15, 66, 96, 95], 2, [1, 5], 66),  # a then d (b rejected), bonus at d
    ([14, 11, 12, 99, 15, 97, 88, 95], 2, [4, 6], 88),  # the other branch: e then f
    ([42, 11, 12, 99, 15, 97, 88, 5], 0, [], 42),  # nothing: the bonus is the target's token at the root
    ([10, 99, 12, 99, 98, 97, 96, 95], 1, [1], 99),  # a only; b's match under a rejected parent is ignored
])
def test_greedy_acceptance_on_a_hand_tree(argmax, accepted, path, bonus) -> None:
    from dflash2.engine.tree import accept_matching

    tree = _hand_tree()
    acc, got_path, got_bonus = accept_matching(tree, torch.tensor([argmax]))
    assert acc.tolist() == [accepted] and got_bonus.tolist() == [bonus]
    assert got_path[0].tolist() == path + [-1] * (7 - len(path))


def test_greedy_acceptance_deepest_then_lowest_index() -> None:
    """Two accepted paths of the same depth (duplicate tokens under different parents): the lower
    node index wins; padding whose token happens to match is never accepted."""
    from dflash2.engine.tree import TokenTree, accept_matching

    tokens = torch.tensor([[5, 10, 10, 20, 20, 5]])
    parent = torch.tensor([[-1, 0, 0, 1, 2, -1]])
    depth = torch.tensor([[0, 1, 1, 2, 2, 0]])
    valid = torch.tensor([[True] * 5 + [False]])
    tree = TokenTree(tokens, parent, depth, torch.zeros_like(tokens), torch.zeros(1, 6), valid, valid)
    acc, path, bonus = accept_matching(tree, torch.tensor([[10, 20, 20, 7, 8, 9]]))
    assert acc.tolist() == [2] and path[0, :2].tolist() == [1, 3] and bonus.tolist() == [7]


@pytest.mark.parametrize("seed", range(6))
def test_chain_tree_acceptance_equals_verify_block(seed) -> None:
    """On a chain-shaped tree (k = 1, or B = N + 1) greedy tree acceptance is `verify_block` at
    T = 0 on the block [anchor, chain]: same accepted count, same next token. The target's argmax
    at node d is the argmax of block row d; logits are drawn so that acceptance stops anywhere."""
    from dflash2.engine.tree import accept_matching
    from dflash2.kernels.verify import verify_block

    g = torch.Generator().manual_seed(seed)
    bsz, n, k, vocab = 8, 5, 3, 12
    problem = _problem(bsz, n, k, vocab=vocab, seed=seed)
    tokens, chosen, q = _walk(problem)
    tree = build_tree(*problem, budget=n + 1)
    logits = torch.randn(bsz, n + 1, vocab, generator=g)
    stop = torch.randint(0, n + 1, (bsz,), generator=g)  # row b matches the draft before `stop[b]`
    for b in range(bsz):
        for j in range(int(stop[b])):
            logits[b, j, tokens[b, j]] = 10.0
    zeros = torch.zeros(bsz, dtype=torch.long)
    acc_ref, next_ref = verify_block(logits, tokens, problem[1], q, torch.zeros(bsz), zeros, zeros, impl="torch")
    target_argmax = logits.argmax(-1).gather(1, tree.depth)  # node i's row is its depth
    acc, path, bonus = accept_matching(tree, target_argmax)
    assert torch.equal(acc, acc_ref) and torch.equal(bonus, next_ref)
    assert (acc >= stop).all()
    for b in range(bsz):
        assert path[b, :acc[b]].tolist() == list(range(1, int(acc[b]) + 1))


def test_tree_accepts_at_least_the_chain() -> None:
    """A tree with the chain inside accepts at least what the chain does, and more when the
    target follows a branch off the chain (here: the first best-first node's root path)."""
    from dflash2.engine.tree import accept_matching

    bsz, n = 4, 4
    problem = _problem(bsz, n, 3, seed=5)
    tree = build_tree(*problem, budget=12)
    chain = build_tree(*problem, budget=n + 1)
    target = torch.full((bsz, 12), -1, dtype=torch.long)
    target[0, :n] = tree.tokens[0, 1:n + 1]  # row 0: the target follows the chain
    want, want_chain = [n], [n]
    for b in range(1, bsz):
        node, path = n + 1, []  # the first node past the chain
        while node > 0:
            path.append(node)
            node = int(tree.parent[b, node])
        path.reverse()
        for par, child in zip([0] + path[:-1], path):
            target[b, par] = tree.tokens[b, child]
        want.append(len(path))
        want_chain.append(sum(1 for _ in itertools.takewhile(lambda i: i <= n, path)))  # chain nodes: 1..N
    acc, _, bonus = accept_matching(tree, target)
    acc_chain, _, _ = accept_matching(chain, target[:, :n + 1])
    assert acc.tolist() == want and acc_chain.tolist() == want_chain
    assert (acc > acc_chain)[1:].all() and (bonus == -1).all()
