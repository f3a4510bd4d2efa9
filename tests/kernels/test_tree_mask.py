"""Tree attention mask: reference vs explicit loops on hand-built trees; Triton vs reference."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine.tree import build_tree
from dflash2.kernels.tree_mask import (
    _tree_mask_triton,
    tree_ancestors,
    tree_attention_mask,
    tree_mask_reference,
    tree_positions,
)

# root 0; 1, 4 under root; 2 under 1; 3 under 2; 5 under 1; 6 padding
HAND_PARENT = [-1, 0, 1, 2, 0, 1, -1]
HAND_DEPTH = [0, 1, 2, 3, 1, 2, 0]


def _explicit(parent: list[int], ctx: int, kv: int) -> list[list[bool]]:
    rows = []
    for i in range(len(parent)):
        path, node = set(), i
        while node >= 0:
            path.add(node)
            node = parent[node]
        rows.append([s < ctx or (s - ctx) in path for s in range(kv)])
    return rows


def test_reference_on_a_hand_tree() -> None:
    parent = torch.tensor([HAND_PARENT, [-1, 0, 0, 0, 1, 4, 5]])
    ctx = torch.tensor([3, 0])
    mask = tree_mask_reference(parent, ctx, 12)
    assert mask.shape == (2, 7, 12) and mask.dtype == torch.bool
    for b in range(2):
        assert mask[b].tolist() == _explicit(parent[b].tolist(), int(ctx[b]), 12)
    anc = tree_ancestors(parent)
    assert anc[0, 3].tolist() == [True, True, True, True, False, False, False]
    assert anc[0, 6].tolist() == [False] * 6 + [True]  # padding: itself only
    assert anc[1, 6].tolist() == [True, True, False, False, True, True, True]  # 6 -> 5 -> 4 -> 1 -> 0
    pos = tree_positions(torch.tensor([HAND_DEPTH, HAND_DEPTH]), ctx)
    assert pos[0].tolist() == [3, 4, 5, 6, 4, 5, 3]


def test_chain_mask_is_causal() -> None:
    """A chain-shaped tree gives the engine's causal block mask (`slot <= position`)."""
    n, ctx, kv = 6, torch.tensor([5, 9]), 20
    parent = torch.arange(-1, n - 1).expand(2, n)
    mask = tree_mask_reference(parent, ctx, kv)
    pos = tree_positions(torch.arange(n).expand(2, n), ctx)
    assert torch.equal(mask, torch.arange(kv)[None, None, :] <= pos[..., None])


@pytest.mark.parametrize("bsz,n_nodes,k,kv,block", [(3, 7, 3, 37, 16), (2, 12, 2, 100, 32), (1, 1, 2, 5, 16),
                                                    (4, 9, 4, 300, 1024)])
def test_triton_matches_reference(triton_device, bsz, n_nodes, k, kv, block) -> None:
    n = 4
    unary = torch.randn(bsz, n, k)
    cand = torch.randint(0, 40, (bsz, n, k))
    eta, a, z = torch.randn(bsz, n, 3), torch.randn(40, 3), torch.randn(40, 3)
    anchor = torch.randint(0, 40, (bsz,))
    tree = build_tree(unary, cand, eta, a, z, anchor, budget=n_nodes)
    ctx = torch.randint(0, max(1, kv - n_nodes), (bsz,))
    ctx[0] = kv - n_nodes // 2  # this row's tree runs past the keys: cut off, as the reference
    parent, ctx = tree.parent.to(triton_device), ctx.to(triton_device)
    ref = tree_mask_reference(parent, ctx, kv)
    out = _tree_mask_triton(parent, ctx, kv, block=block)
    assert out.dtype == torch.bool and torch.equal(out, ref)
    assert torch.equal(tree_attention_mask(parent, ctx, kv, impl="triton"), ref)


def test_triton_hand_tree_with_padding(triton_device) -> None:
    parent = torch.tensor([HAND_PARENT], device=triton_device)
    ctx = torch.tensor([2], device=triton_device)
    out = tree_attention_mask(parent, ctx, 11, impl="triton")
    assert out[0].tolist() == _explicit(HAND_PARENT, 2, 11)


def test_dispatch_checks() -> None:
    with pytest.raises(ValueError, match="resolved"):
        tree_attention_mask(torch.tensor([[-1]]), torch.tensor([0]), 4, impl="auto")
    with pytest.raises(ValueError, match="Bt"):
        tree_attention_mask(torch.tensor([-1]), torch.tensor([0]), 4, impl="torch")
