"""Tree attention mask (tree verify, `dflash2.engine.tree`): obviously-right PyTorch.

The tree's B nodes run as one target forward whose queries are the nodes. Node i's K/V go to
static-cache slot `context_len + i` (node order, so the chain, nodes 0..N, sits at the slots of
its positions), its RoPE position is `context_len + depth[i]`, and it may see

    key slot s   iff   s < context_len                                (the committed context)
                 or    s = context_len + j with j ancestor-or-self of i (its root path)

which is the `[B, q, kv]` `visible` layout of `dflash2.kernels.row_attention` (q = tree nodes).
"""

from __future__ import annotations

import torch


def tree_ancestors(parent: torch.Tensor) -> torch.Tensor:
    """`[Bt, B, B]` bool, `anc[b, i, j]` = node j is node i or one of its ancestors.

    Args:
        parent: `[Bt, B]` int64 parent index (< the node's own index), -1 at roots and padding.
    """
    bsz, n = parent.shape
    eye = torch.eye(n, dtype=torch.bool, device=parent.device).expand(bsz, n, n)
    anc = eye.clone()
    cur = parent.long()
    rows = torch.arange(bsz, device=parent.device)[:, None]
    for _ in range(n - 1):  # a root path has at most B nodes
        live = cur >= 0
        anc = anc | (eye[rows, cur.clamp(min=0)] & live[..., None])
        cur = torch.where(live, parent.long()[rows, cur.clamp(min=0)], cur)
    return anc


def tree_positions(depth: torch.Tensor, context_len: torch.Tensor) -> torch.Tensor:
    """`[Bt, B]` int64 absolute positions of the nodes: `context_len[:, None] + depth`."""
    return context_len.long()[:, None] + depth.long()


def tree_mask_reference(parent: torch.Tensor, context_len: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Reference of :func:`dflash2.kernels.tree_mask.tree_attention_mask` (`[Bt, B, kv_len]` bool)."""
    bsz, n = parent.shape
    anc = tree_ancestors(parent)  # [Bt, B, B]
    slots = torch.arange(kv_len, device=parent.device)[None, None, :]
    ctx = context_len.long()[:, None, None]
    rel = slots - ctx  # [Bt, 1, kv]
    in_tree = (rel >= 0) & (rel < n)
    tree_vis = anc.gather(2, rel.clamp(0, max(n - 1, 0)).expand(bsz, n, kv_len)) & in_tree
    return (slots < ctx) | tree_vis
