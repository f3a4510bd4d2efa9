"""Token trees for tree verify (issue 43 item 2): the expansion rule and the acceptance.

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
with node index = depth: at T = 0 a tree verify accepts at least what the chain verify accepts,
and an accepted path that stays on the chain needs no K/V move. The chain is the greedy walk over
the same edge scores (`tree_edge_scores`, the walk's own `transition_scores`), or, when given,
the walk's realized candidate indices (`chain=`), so a tree built from a proposal always holds
the tokens the proposer actually drafted.

Acceptance (`accept_matching`), greedy and sampled alike: the target gives one token per node,
`t(i)` = the token it emits after node i's root path: its argmax at T = 0; at T > 0 its draw
from the filtered law at node i's logits row, keyed by the row's seed and the position after
node i (`start + 1 + depth`), the very draw the AR loop makes at that position
(`dflash2.kernels.verify.verify_block` with no drafted token). A non-root node is accepted iff
its parent is accepted and its token equals `t(parent)`; the accepted path is the deepest
accepted node's root path (ties -> lowest node index), and the bonus token is `t` at that node.
Siblings hold distinct tokens, so the accepted nodes form one path, and every committed token is
the target's own token at its position given the committed prefix: the output follows the
target's law (it is, draw for draw, the AR loop's output for the same target logits), whatever
the tree holds. The tree only decides how many of those tokens one forward confirms. At T = 0
on a chain-shaped tree this is `verify_block` (tests/engine/test_tree.py). At T > 0 a node
whose token has target probability p is accepted with probability p, below speculative
sampling's `min(1, p / q)` for a chain: a tree pays for its extra nodes that way, which the
evaluation's per-depth acceptance shows.

All functions are device ops with fixed shapes and no host syncs (the expansion loops over B
inside one kernel with `impl="triton"`; the torch reference loops over B in Python ints), so
they can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash2.kernels.selector import transition_scores
from dflash2.kernels.tree_expand import expand_nodes


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


def expand_tree(edges: torch.Tensor, cand_ids: torch.Tensor, anchor: torch.Tensor, budget: int,
                chain: torch.Tensor | None = None, impl: str = "torch") -> TokenTree:
    """The module's expansion rule: a tree of `budget` nodes per request, best-first after the chain.

    Args:
        edges: `[Bt, N, k, k]` edge scores (`tree_edge_scores`).
        cand_ids: `[Bt, N, k]` int64 candidate ids.
        anchor: `[Bt]` int64 root token.
        budget: B >= 1, nodes per tree, root included.
        chain: `[Bt, N]` int64 candidate indices of the chain to keep (the walk's `chosen`);
            None = `greedy_chain(edges)`.
        impl: the expansion loop's kernel, `"torch"` or `"triton"` (`dflash2.kernels.tree_expand`:
            one launch instead of ~40 per node; the same tree).
    Returns:
        A `TokenTree` of `B` nodes (see the module docstring for the order and the guarantees).
    """
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1, got {budget}")
    if chain is None:
        chain = greedy_chain(edges)
    logp = torch.log_softmax(edges.float(), dim=-1)  # [Bt, N, k, k]
    return TokenTree(*expand_nodes(logp, cand_ids, anchor, budget, chain, impl))


def build_tree(unary: torch.Tensor, cand_ids: torch.Tensor, eta: torch.Tensor, pred_codebook: torch.Tensor,
               succ_codebook: torch.Tensor, anchor: torch.Tensor, budget: int,
               chain: torch.Tensor | None = None, impl: str = "torch") -> TokenTree:
    """`expand_tree(tree_edge_scores(...), cand_ids, anchor, budget, chain, impl)`: the tree of a
    DFlash2 proposal (the proposer's `selector_walk` inputs; shapes as there)."""
    edges = tree_edge_scores(unary, cand_ids, eta, pred_codebook, succ_codebook, anchor)
    return expand_tree(edges, cand_ids, anchor, budget, chain, impl)


def ancestor_matrix(parent: torch.Tensor) -> torch.Tensor:
    """`[Bt, B, B]` bool, `anc[b, i, j]` = node j is node i or one of its ancestors: the same as
    `dflash2.kernels.tree_mask.tree_ancestors`, by pointer doubling (ceil(log2 B) boolean matrix
    products instead of B - 1 steps up the tree, so a few launches at any B)."""
    bsz, n = parent.shape
    eye = torch.eye(n, dtype=torch.bool, device=parent.device).expand(bsz, n, n)
    up = parent[..., None] == torch.arange(n, device=parent.device)  # one-hot parent (none at -1), no host sync
    reach = (eye | up).float()  # reach within 1 step; after t squarings, within 2^t steps
    for _ in range(max(0, (n - 1).bit_length())):
        reach = (torch.bmm(reach, reach) > 0).float()
    return reach > 0


def accept_matching(tree: TokenTree, target_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Acceptance of a token tree against the target's own token at every node.

    Args:
        tree: `B` nodes per request.
        target_tokens: `[Bt, B]` int64, the target's token at every node: the token it emits after
            the node's root path (its argmax at T = 0, its keyed draw at the next position at
            T > 0: `DecodeState._tree_verify`).
    Returns:
        `(accepted [Bt] int64, path [Bt, B - 1] int64, bonus [Bt] int64)`: a non-root node is
        accepted iff its parent is and its token equals `target_tokens` at its parent;
        `accepted` = the deepest accepted node's depth (ties -> lowest node index),
        `path[:, :accepted]` that node's root path at depths 1..accepted (-1 after), `bonus` =
        `target_tokens` at that node. The children of a node hold distinct tokens, so at most
        one child of an accepted node is accepted: the accepted nodes form one path, and every
        token the step commits is the target's own token at its position. Device ops with fixed
        shapes, no loop over B.
    """
    bsz, budget = tree.tokens.shape
    dev = tree.tokens.device
    rows = torch.arange(bsz, device=dev)
    par = tree.parent.clamp(min=0)
    hit = tree.valid & (tree.parent >= 0) & (tree.tokens == target_tokens.gather(1, par))
    hit[:, 0] = True  # the root
    anc = ancestor_matrix(tree.parent)
    ok = ~(anc & ~hit[:, None, :]).any(-1)  # every node on the root path (itself included) hit
    deep = torch.where(ok, tree.depth, -1)
    best = (deep == deep.max(-1, keepdim=True).values).to(torch.int8).argmax(-1)  # deepest, lowest index
    accepted = tree.depth[rows, best]
    bonus = target_tokens[rows, best]
    on_path = anc[rows, best] & (tree.depth > 0)  # [Bt, B]: the path's nodes, root excluded
    nodes = torch.arange(budget, device=dev).expand(bsz, budget)
    col = torch.where(on_path, tree.depth - 1, budget - 1)  # depths are distinct on a path; B - 1: dump
    path = torch.full((bsz, budget), -1, dtype=torch.long, device=dev)
    path.scatter_reduce_(1, col, torch.where(on_path, nodes, -1), reduce="amax")
    return accepted, path[:, :budget - 1], bonus
