"""Best-first token-tree expansion (tree verify, `dflash2.engine.tree`): obviously-right PyTorch.

The rule (documented in full in `dflash2.engine.tree`): node 0 is the root; each later node is
taken from the frontier (the not yet taken children of taken nodes of depth < N), the next node
of the given chain first while any is left, then the highest path score (ties -> the lowest
frontier index `parent_node * k + c`); when the frontier is empty the rest is padding. One loop
iteration per node; every op is a device op with fixed shapes (graph-capturable, no host sync).
"""

from __future__ import annotations

import torch

NodeArrays = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                   torch.Tensor]


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last dim (0 when none)."""
    return mask.to(torch.int8).argmax(-1)


def expand_reference(logp: torch.Tensor, cand_ids: torch.Tensor, anchor: torch.Tensor, budget: int,
                     chain: torch.Tensor) -> NodeArrays:
    """Reference of :func:`dflash2.kernels.tree_expand.expand_nodes` (shapes and outputs as there)."""
    bsz, n, k = cand_ids.shape
    dev = logp.device
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

    def push(i: int) -> None:
        # Children of node i (one per request): the k candidates of slot `depth[:, i]`.
        node_depth = depth[:, i]
        can = valid[:, i] & (node_depth < n)  # [Bt]
        if n == 0:
            return
        slot = node_depth.clamp(max=n - 1)
        child = logp[rows, slot, cand[:, i].clamp(min=0)]  # [Bt, k]; the root's row is any p (all equal)
        f_score[:, i * k:(i + 1) * k] = torch.where(can[:, None], score[:, i, None] + child, float("-inf"))
        f_open[:, i * k:(i + 1) * k] = can[:, None]
        next_c = chain[rows, slot].long()
        f_chain[:, i * k:(i + 1) * k] = can[:, None] & on_chain[:, i, None] & (lanes[None, :] == next_c[:, None])

    push(0)
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
        push(i)
    return tokens, parent, depth, cand, score, valid, on_chain
