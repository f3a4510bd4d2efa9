"""Best-first token-tree expansion for tree verify (`dflash2.engine.tree`, issue 43 item 2).

The rule is a loop over the tree's B nodes (each node is picked from the frontier the earlier
picks opened). As PyTorch ops that is about 40 small kernels per node (2,500 launches for a
64-node tree), which on a host slow at launching kernels costs more than the target forward it
feeds. The Triton kernel runs the whole loop in one launch, one program per request, with the
frontier in registers. `expand_reference` is the rule in PyTorch; the two agree exactly (same fp32
additions, same tie-breaking) except where a score is NaN (the reference then takes the first
open entry; such proposals are flagged invalid by the engine either way).
"""

from __future__ import annotations

import torch

from dflash2.kernels.tree_expand.reference import NodeArrays, expand_reference

try:
    from dflash2.kernels.tree_expand import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["expand_nodes", "expand_reference", "NodeArrays"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _expand_triton(logp: torch.Tensor, cand_ids: torch.Tensor, anchor: torch.Tensor, budget: int,
                   chain: torch.Tensor) -> NodeArrays:
    bsz, n, k = cand_ids.shape
    dev = logp.device
    logp = logp.float().contiguous()
    cand_ids = cand_ids.long().contiguous()
    chain = chain.long().contiguous()
    anchor = anchor.long().contiguous()
    longs = dict(dtype=torch.long, device=dev)
    tokens, parent = torch.empty(bsz, budget, **longs), torch.empty(bsz, budget, **longs)
    depth, cand = torch.empty(bsz, budget, **longs), torch.empty(bsz, budget, **longs)
    score = torch.empty(bsz, budget, dtype=torch.float32, device=dev)
    valid = torch.empty(bsz, budget, dtype=torch.int8, device=dev)
    on_chain = torch.empty(bsz, budget, dtype=torch.int8, device=dev)
    if bsz:
        if n == 0:  # no slots: keep a valid pointer for the (masked) loads
            logp = logp.new_full((bsz, 1, k, k), float("-inf"))
            chain = chain.new_zeros(bsz, 1)
            cand_ids = cand_ids.new_zeros(bsz, 1, k)
        _tk._expand_kernel[(bsz,)](
            logp, cand_ids, anchor, chain, tokens, parent, depth, cand, score, valid, on_chain,
            budget, n, k, logp.stride(0), cand_ids.stride(0), chain.stride(0), tokens.stride(0),
            FR=_next_pow2(max(budget * k, 16)), NB=_next_pow2(max(budget, 16)), num_warps=4)
    return tokens, parent, depth, cand, score, valid.view(torch.bool), on_chain.view(torch.bool)


def expand_nodes(logp: torch.Tensor, cand_ids: torch.Tensor, anchor: torch.Tensor, budget: int,
                 chain: torch.Tensor, impl: str) -> NodeArrays:
    """The expansion rule's node arrays, B = `budget` nodes per request.

    Args:
        logp: `[Bt, N, k, k]` fp32 edge log-probabilities, `logp[b, j, p, c]` = log of the
            selector's law of candidate c of slot j after candidate p of slot j - 1 (slot 0: any p,
            all rows equal).
        cand_ids: `[Bt, N, k]` int64 candidate ids. anchor: `[Bt]` int64 root token.
        budget: B >= 1. chain: `[Bt, N]` int64 candidate indices of the chain taken first.
        impl: `"torch"` or `"triton"`, already resolved.
    Returns:
        `(tokens, parent, depth, cand, score, valid, on_chain)`, each `[Bt, B]`: int64, int64,
        int64, int64, fp32, bool, bool, as `dflash2.engine.tree.TokenTree` documents them.
    """
    if impl == "torch":
        return expand_reference(logp, cand_ids, anchor, budget, chain)
    if impl == "triton":
        if _tk is None:
            raise RuntimeError("impl='triton' needs the 'triton' package (`pip install triton`).")
        return _expand_triton(logp, cand_ids, anchor, budget, chain)
    raise ValueError(f"impl must be resolved to 'torch' or 'triton', got {impl!r}")
