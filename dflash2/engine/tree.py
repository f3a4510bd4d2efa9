"""Token trees for tree verify (issue 43 item 2): the expansion rule and greedy tree acceptance.

The drafter proposes, for each of the N slots of a block, top-k candidates `C_j` with unary
scores `U_j`; the candidate selector scores an edge from a predecessor token p to candidate c of
slot j as (`dflash2.kernels.selector`, spec 5.3)

    S_j(p, c) = U_j[c] + sum_r A[p, r] * eta_j[r] * Z[C_j[c], r]

and the greedy walk picks, from the anchor, `c*_j = argmax_c S_j(c*_{j-1}, c)` (ties -> lowest
index). A token tree reuses those edges: a node at depth d >= 1 is candidate c of slot d - 1
(0-based), its parent is a node at depth d - 1 (the root, at depth 0, is the anchor), and its
children are the k candidates of slot d scored from its own token.

Expansion rule (`expand_tree`), per request, with budget B nodes (the root included):

1. Path score of a node = sum over the edges on its root path of `log_softmax_c S_j(p, c)`,
   the log of the selector's law at T = 1 (fp32; 0 at the root). It never increases along a path.
2. Node 0 is the root. Each later node is taken from the frontier (the not yet taken children of
   taken nodes of depth < N), in this order of priority:
   a. the next node of the greedy chain (the child `c*_d` of the chain node at depth d), while
      any is left: nodes 1..min(N, B - 1) are the chain, in depth order;
   b. otherwise the frontier node with the highest path score; ties -> the lowest frontier
      index `parent_node * k + c`, i.e. the earlier-taken parent, then the lower candidate index.
   A parent is always taken before its children, so node order is topological.
3. When the frontier is empty (the whole k-ary tree of depth N has fewer than B nodes), the
   remaining nodes are padding: `valid = False`, `parent = -1`, `depth = 0`, token = anchor.

So for B >= N + 1 the chain (the selector's greedy walk) is always in the tree, as nodes 0..N
with node index = depth: a greedy tree verify accepts at least what the chain verify accepts,
and an accepted path that stays on the chain needs no K/V move. The chain is the greedy walk over
the same edge scores (`tree_edge_scores`, the walk's own `transition_scores`), or, when given,
the walk's realized candidate indices (`chain=`), so a tree built from a proposal always holds
the tokens the proposer actually drafted.

Greedy acceptance (`accept_greedy`): a non-root node is accepted iff its parent is accepted and
its token equals the target's argmax at its parent (the token the target predicts after the
parent's path); the accepted path is the deepest accepted node's root path (ties -> lowest node
index), and the bonus token is the target's argmax at that node. On a chain-shaped tree this is
`verify_block` at T = 0 (tests/engine/test_tree.py).

All functions are device ops with fixed shapes and no host syncs (loops run over B or N, Python
ints), so they can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash2.kernels.selector import transition_scores


@dataclass
class TokenTree:
    """A batch of token trees of `B` nodes each (`Bt` requests), node 0 the root (the anchor).

    Attributes:
        tokens: `[Bt, B]` int64 token of each node (the anchor at the root and at padding).
        parent: `[Bt, B]` int64 parent node index, -1 at the root and at padding; always lower
            than the node's own index.
        depth: `[Bt, B]` int64, 0 at the root and at padding; `depth[parent] + 1` otherwise.
        cand: `[Bt, B]` int64 candidate index of the node in its slot (`depth - 1`); -1 at the
            root and at padding.
        score: `[Bt, B]` fp32 path score (sum of the edges' log-softmax), 0 at the root, -inf at
            padding.
        valid: `[Bt, B]` bool, False at padding.
        on_chain: `[Bt, B]` bool, True for the root and the greedy chain's nodes.
    """

    tokens: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    cand: torch.Tensor
    score: torch.Tensor
    valid: torch.Tensor
    on_chain: torch.Tensor


def tree_edge_scores(unary: torch.Tensor, cand_ids: torch.Tensor, eta: torch.Tensor, pred_codebook: torch.Tensor,
                     succ_codebook: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Every selector edge a tree can use: `[Bt, N, k, k]` fp32, `E[b, j, p, c] = S_j(pred, c)`.

    Args:
        unary: `[Bt, N, k]` fp32 unary scores (the draft head's top-k values).
        cand_ids: `[Bt, N, k]` int64 candidate ids.
        eta: `[Bt, N, R]` selector gates; `pred_codebook`, `succ_codebook`: `[V, R]` (A, Z).
        anchor: `[Bt]` int64 anchor token.
    Returns:
        `E` with `pred = anchor` for slot 0 (the same row for every p) and `pred = C[b, j-1, p]`
        for slot j >= 1: the rows the selector walk scores, through its `transition_scores`.
    """
    bsz, n, k = unary.shape
    if n == 0:
        return unary.new_zeros(bsz, 0, k, k, dtype=torch.float32)
    cand = cand_ids.long()
    first = unary[:, 0].float() + transition_scores(anchor.long(), eta[:, 0], cand[:, 0], pred_codebook,
                                                    succ_codebook)  # [Bt, k], the walk's slot-0 row
    first = first[:, None, None, :].expand(bsz, 1, k, k)
    if n == 1:
        return first.contiguous()
    rank = eta.shape[-1]
    rest = unary[:, 1:, None, :].float() + transition_scores(
        cand[:, :-1], eta[:, 1:, None, :].expand(bsz, n - 1, k, rank),
        cand[:, 1:, None, :].expand(bsz, n - 1, k, k), pred_codebook, succ_codebook)  # [Bt, N-1, k, k]
    return torch.cat([first, rest], dim=1)


def greedy_chain(edges: torch.Tensor) -> torch.Tensor:
    """`[Bt, N]` int64 candidate indices of the greedy walk over `edges [Bt, N, k, k]`: from
    p = 0 at slot 0, `c_j = argmax_c edges[:, j, c_{j-1}, c]` (ties -> lowest index), the walk's
    rule at T = 0."""
    bsz, n, k, _ = edges.shape
    rows = torch.arange(bsz, device=edges.device)
    prev = torch.zeros(bsz, dtype=torch.long, device=edges.device)
    picks = []
    for j in range(n):
        prev = edges[rows, j, prev].argmax(-1)
        picks.append(prev)
    return torch.stack(picks, 1) if picks else torch.zeros(bsz, 0, dtype=torch.long, device=edges.device)


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim (0 when none)."""
    return mask.to(torch.int8).argmax(-1)


def expand_tree(edges: torch.Tensor, cand_ids: torch.Tensor, anchor: torch.Tensor, budget: int,
                chain: torch.Tensor | None = None) -> TokenTree:
    """The module's expansion rule: a tree of `budget` nodes per request, best-first after the chain.

    Args:
        edges: `[Bt, N, k, k]` edge scores (`tree_edge_scores`).
        cand_ids: `[Bt, N, k]` int64 candidate ids.
        anchor: `[Bt]` int64 root token.
        budget: B >= 1, nodes per tree, root included.
        chain: `[Bt, N]` int64 candidate indices of the chain to keep (the walk's `chosen`);
            None = `greedy_chain(edges)`.
    Returns:
        A `TokenTree` of `B` nodes (see the module docstring for the order and the guarantees).
    """
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1, got {budget}")
    bsz, n, k = cand_ids.shape
    dev = edges.device
    if chain is None:
        chain = greedy_chain(edges)
    logp = torch.log_softmax(edges.float(), dim=-1)  # [Bt, N, k, k]
    rows = torch.arange(bsz, device=dev)
    lanes = torch.arange(k, device=dev)
    frontier = budget * k  # entry i*k + c: candidate c of the slot below node i
    f_score = torch.full((bsz, frontier), float("-inf"), device=dev)
    f_open = torch.zeros(bsz, frontier, dtype=torch.bool, device=dev)
    f_chain = torch.zeros(bsz, frontier, dtype=torch.bool, device=dev)
    tokens = anchor.long()[:, None].repeat(1, budget)
    parent = torch.full((bsz, budget), -1, dtype=torch.long, device=dev)
    depth = torch.zeros(bsz, budget, dtype=torch.long, device=dev)
    cand = torch.full((bsz, budget), -1, dtype=torch.long, device=dev)
    score = torch.full((bsz, budget), float("-inf"), device=dev)
    valid = torch.zeros(bsz, budget, dtype=torch.bool, device=dev)
    on_chain = torch.zeros(bsz, budget, dtype=torch.bool, device=dev)
    score[:, 0], valid[:, 0], on_chain[:, 0] = 0.0, True, True

    def push(i: int, node_depth: torch.Tensor, node_cand: torch.Tensor, node_score: torch.Tensor,
             node_chain: torch.Tensor, node_valid: torch.Tensor) -> None:
        # Children of node i (one per request): the k candidates of slot `node_depth`.
        can = node_valid & (node_depth < n)  # [Bt]
        if n == 0:
            return
        slot = node_depth.clamp(max=n - 1)
        child = logp[rows, slot, node_cand.clamp(min=0)]  # [Bt, k]; the root's row is any p (all equal)
        f_score[:, i * k:(i + 1) * k] = torch.where(can[:, None], node_score[:, None] + child, float("-inf"))
        f_open[:, i * k:(i + 1) * k] = can[:, None]
        next_c = chain[rows, slot].long()
        f_chain[:, i * k:(i + 1) * k] = can[:, None] & node_chain[:, None] & (lanes[None, :] == next_c[:, None])

    push(0, depth[:, 0], cand[:, 0], score[:, 0], on_chain[:, 0], valid[:, 0])
    for i in range(1, budget):
        sc = torch.where(f_open, f_score, float("-inf"))
        best = f_open & (sc == sc.max(-1, keepdim=True).values)
        best = torch.where(best.any(-1, keepdim=True), best, f_open)  # NaN scores: first open entry
        chain_open = f_open & f_chain
        pick_mask = torch.where(chain_open.any(-1, keepdim=True), chain_open, best)
        ok = f_open.any(-1)  # [Bt]
        f = _first_true(pick_mask)  # [Bt]
        par, c = f // k, f % k
        d = depth[rows, par] + 1
        slot = (d - 1).clamp(min=0, max=max(n - 1, 0))
        tok = cand_ids.long()[rows, slot, c] if n > 0 else anchor.long()
        tokens[:, i] = torch.where(ok, tok, anchor.long())
        parent[:, i] = torch.where(ok, par, -1)
        depth[:, i] = torch.where(ok, d, 0)
        cand[:, i] = torch.where(ok, c, -1)
        score[:, i] = torch.where(ok, f_score[rows, f], float("-inf"))
        valid[:, i] = ok
        on_chain[:, i] = ok & chain_open[rows, f]
        f_open[rows, f] = f_open[rows, f] & ~ok
        push(i, depth[:, i], cand[:, i], score[:, i], on_chain[:, i], valid[:, i])
    return TokenTree(tokens, parent, depth, cand, score, valid, on_chain)


def build_tree(unary: torch.Tensor, cand_ids: torch.Tensor, eta: torch.Tensor, pred_codebook: torch.Tensor,
               succ_codebook: torch.Tensor, anchor: torch.Tensor, budget: int,
               chain: torch.Tensor | None = None) -> TokenTree:
    """`expand_tree(tree_edge_scores(...), cand_ids, anchor, budget, chain)`: the tree of a
    DFlash2 proposal (the proposer's `selector_walk` inputs; shapes as there)."""
    edges = tree_edge_scores(unary, cand_ids, eta, pred_codebook, succ_codebook, anchor)
    return expand_tree(edges, cand_ids, anchor, budget, chain)


def accept_greedy(tree: TokenTree, target_argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance of a token tree (module docstring).

    Args:
        tree: `B` nodes per request.
        target_argmax: `[Bt, B]` int64, the target's argmax at every node (its next token after
            the node's root path).
    Returns:
        `(accepted [Bt] int64, path [Bt, B - 1] int64, bonus [Bt] int64)`: `accepted` = the
        accepted path's length (the deepest accepted node's depth, ties -> lowest node index),
        `path[:, :accepted]` its node indices at depths 1..accepted (-1 after), `bonus` =
        `target_argmax` at that deepest node (the token after the accepted path).
    """
    bsz, budget = tree.tokens.shape
    dev = tree.tokens.device
    rows = torch.arange(bsz, device=dev)
    ok = torch.zeros(bsz, budget, dtype=torch.bool, device=dev)
    ok[:, 0] = True
    for i in range(1, budget):
        par = tree.parent[:, i].clamp(min=0)
        hit = tree.tokens[:, i] == target_argmax[rows, par]
        ok[:, i] = tree.valid[:, i] & (tree.parent[:, i] >= 0) & ok[rows, par] & hit
    deep = torch.where(ok, tree.depth, -1)
    best = _first_true(deep == deep.max(-1, keepdim=True).values)  # deepest, lowest index
    accepted = tree.depth[rows, best]
    bonus = target_argmax[rows, best]
    path = torch.full((bsz, budget), -1, dtype=torch.long, device=dev)  # last column: a dump slot
    node = best
    for _ in range(budget - 1):  # walk up: the node at depth d goes to column d - 1
        d = tree.depth[rows, node]
        live = d > 0
        col = torch.where(live, d - 1, budget - 1)
        path.scatter_(1, col[:, None], torch.where(live, node, -1)[:, None])
        node = torch.where(live, tree.parent[rows, node].clamp(min=0), node)
    return accepted, path[:, :budget - 1], bonus
