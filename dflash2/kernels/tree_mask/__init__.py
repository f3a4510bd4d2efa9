"""Tree attention mask for tree verify (`dflash2.engine.tree`, issue 43 item 2).

Decision: the kernel builds the mask rather than applying tree visibility inside the Triton
row-attention kernel. The mask comes out in the `[B, q, kv]` bool layout of
`dflash2.kernels.row_attention.visible_mask`, so it drops into the engine's torch attention
path (`StaticTargetCache.attention_kwargs`' `dfl2_masks`, read by `row_attention`) without a
second attention kernel; the Triton row-attention kernel derives visibility from positions
(`slot <= position`), which a tree (siblings share a position) cannot express, and teaching it
ancestor bits is a later step. At B <= 64 nodes the mask is `B * kv` bytes per request.
Sliding windows are not handled (no window argument): the families tested are full-attention.
"""

from __future__ import annotations

import torch

from dflash2.kernels.tree_mask.reference import tree_ancestors, tree_mask_reference, tree_positions

try:
    from dflash2.kernels.tree_mask import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["tree_attention_mask", "tree_mask_reference", "tree_ancestors", "tree_positions"]

_BLOCK = 1024  # key slots per program


def _tree_mask_triton(parent: torch.Tensor, context_len: torch.Tensor, kv_len: int, block: int = _BLOCK):
    bsz, n = parent.shape
    parent = parent.long().contiguous()
    ctx = context_len.long().contiguous()
    out = torch.empty(bsz, n, kv_len, dtype=torch.uint8, device=parent.device)
    if bsz and n and kv_len:
        block = min(block, max(16, 1 << (kv_len - 1).bit_length()))
        grid = (bsz, n, _cdiv(kv_len, block))
        _tk._tree_mask_kernel[grid](parent, ctx, out, n, kv_len, parent.stride(0), out.stride(0), out.stride(1),
                                    BLOCK=block, num_warps=4)
    return out.view(torch.bool)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def tree_attention_mask(parent: torch.Tensor, context_len: torch.Tensor, kv_len: int, impl: str) -> torch.Tensor:
    """Which static-cache key slots each tree node sees, for one target forward over the tree.

    Args:
        parent: `[Bt, B]` int64 parent node index (lower than the node's own), -1 at the root and
            at padding (`dflash2.engine.tree.TokenTree.parent`).
        context_len: `[Bt]` int64 committed K/V length of each request (the root's position).
        kv_len: key slots of the forward (the cache length it reads; `>= context_len + B` for
            every row, or the nodes past it are cut off).
        impl: `"torch"` or `"triton"`, already resolved (`dflash2.kernels.dispatch.resolve_impl`).
    Returns:
        `[Bt, B, kv_len]` bool: slot s is visible to node i iff `s < context_len[b]` or
        `s = context_len[b] + j` with j node i or an ancestor of i (node j's K/V at slot
        `context_len + j`; its position is `tree_positions(depth, context_len)`). A padding node
        sees the context and itself. Fixed shapes, no host sync.
    """
    if parent.dim() != 2 or context_len.shape != parent.shape[:1]:
        raise ValueError(f"parent must be [Bt, B] and context_len [Bt], got {tuple(parent.shape)}, "
                         f"{tuple(context_len.shape)}")
    if impl == "torch":
        return tree_mask_reference(parent, context_len, kv_len)
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _tree_mask_triton(parent, context_len, kv_len)
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")
