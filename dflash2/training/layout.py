"""Training layout (spec 3.2-3.4, 2.5): random anchors, flattened blocks, the attention mask.

For each packed sequence of length S (several documents, `doc_ids`), up to A anchors p_j are
drawn uniformly without replacement among positions with `loss_mask[p] = 1` whose next token
is in the same document, then sorted. Block j is

    tokens     [x_{p_j}, m, ..., m]                      (length Bk = block size)
    positions  pos[p_j] + 0..Bk-1                        (pos restarts per document)
    slot i>=1  predicts x_{p_j+i}; its teacher is the target at p_j+i-1;
               trained iff the anchor is valid, p_j+i < S, doc[p_j+i] = doc[p_j], loss_mask[p_j+i]
    predecessor of slot i (teacher-forced) = x_{p_j+i-1}  (slot 1: the anchor)

The draft sees KV = [context (S) | all blocks (A*Bk)]. A query of block j sees context keys
k < p_j of its own document (the anchor's own feature does not exist yet at serving time) and
every key of its own block (bidirectional unless the draft's layers are causal); sliding
windows, when the draft has them, are measured in absolute positions.

Anchors of a sample depend only on (seed, epoch, sample index): they are fresh each epoch,
the same on 1 or N processes, and need no RNG state to resume.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9)


def anchor_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit generator seed for one (run seed, epoch, sample) triple (splitmix-style mixing)."""
    x = (int(seed) * _MIX[0] + int(epoch) * _MIX[1] + int(index)) & ((1 << 64) - 1)
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (x ^ (x >> 29)) & ((1 << 63) - 1)


def eligible_anchors(loss_mask: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """`[..., S]` bool: p may anchor a block (learned token whose successor is in its document)."""
    nxt_same = torch.zeros_like(loss_mask, dtype=torch.bool)
    nxt_same[..., :-1] = doc_ids[..., 1:] == doc_ids[..., :-1]
    return loss_mask.bool() & nxt_same & (doc_ids >= 0)


def sample_anchors(loss_mask: torch.Tensor, doc_ids: torch.Tensor, num_anchors: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `num_anchors` eligible positions of ONE sequence, uniformly without replacement.

    Args:
        loss_mask, doc_ids: `[S]` of one (unpadded) sample, on CPU.
        num_anchors: A.
        generator: CPU generator (seeded by `anchor_seed`).
    Returns:
        `(anchors [A] int64 sorted, valid [A] bool)`; invalid entries sit at the end, position 0.
    """
    S = loss_mask.shape[0]
    keys = torch.rand(S, generator=generator)                    # one uniform per position
    ok = eligible_anchors(loss_mask, doc_ids)
    keys = torch.where(ok, keys, torch.full_like(keys, 2.0))     # ineligible sort last
    A = int(num_anchors)
    if S < A:
        keys = torch.cat([keys, torch.full((A - S,), 2.0)])
    picked = torch.topk(-keys, A).indices                        # A smallest keys
    valid = keys[picked] < 2.0
    pos = torch.where(valid, picked, torch.full_like(picked, 1 << 40))
    pos, order = torch.sort(pos)                                 # sorted: block-sparse friendly
    valid = valid[order]
    return torch.where(valid, pos, torch.zeros_like(pos)), valid


@dataclass
class BlockLayout:
    """Flattened blocks of a batch (`Bt` rows, `A` anchors, `Bk` block size). All `[Bt, A, Bk]`
    unless noted; index tensors are clamped into `[0, S)` where a slot runs past the sequence."""

    anchors: torch.Tensor       # [Bt, A] anchor positions
    anchor_valid: torch.Tensor  # [Bt, A]
    anchor_doc: torch.Tensor    # [Bt, A] document id of the anchor (-2 if invalid)
    block_ids: torch.Tensor     # token ids [x_p, m, ..., m]
    block_pos: torch.Tensor     # position ids pos[p] + i
    data_idx: torch.Tensor      # p + i (clamped): the data position slot i predicts
    label_mask: torch.Tensor    # bool, slot 0 always False
    pred_ids: torch.Tensor      # teacher-forced predecessor x_{p+i-1} (slot 0: the anchor itself)

    @property
    def num_queries(self) -> int:
        return self.block_ids.shape[1] * self.block_ids.shape[2]


def build_layout(input_ids: torch.Tensor, loss_mask: torch.Tensor, position_ids: torch.Tensor,
                 doc_ids: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor,
                 block_size: int, mask_token_id: int) -> BlockLayout:
    """Blocks for given anchors (vectorized, no host syncs).

    Args:
        input_ids, loss_mask, position_ids, doc_ids: `[Bt, S]` (collated; padding doc = -1).
        anchors, anchor_valid: `[Bt, A]` from `sample_anchors` (padded to a common A).
        block_size: Bk; mask_token_id: the draft's mask id.
    Returns:
        `BlockLayout`.
    """
    Bt, S = input_ids.shape
    dev = input_ids.device
    i = torch.arange(block_size, device=dev)
    raw = anchors[:, :, None] + i                                # [Bt, A, Bk]
    idx = raw.clamp(max=S - 1)
    gather = lambda t: t.gather(1, idx.flatten(1)).view_as(idx)  # noqa: E731  [Bt, A, Bk]
    adoc = torch.where(anchor_valid, doc_ids.gather(1, anchors), torch.full_like(anchors, -2))
    label_mask = (anchor_valid[:, :, None] & (raw < S) & (gather(doc_ids) == adoc[:, :, None])
                  & gather(loss_mask).bool() & (i > 0))
    anchor_tok = input_ids.gather(1, anchors)                    # [Bt, A]
    block_ids = torch.full_like(idx, int(mask_token_id))
    block_ids[:, :, 0] = anchor_tok
    block_pos = position_ids.gather(1, anchors)[:, :, None] + i
    pred_idx = (raw - 1).clamp(min=0, max=S - 1)
    pred_ids = input_ids.gather(1, pred_idx.flatten(1)).view_as(idx)
    return BlockLayout(anchors, anchor_valid, adoc, block_ids, block_pos, idx, label_mask, pred_ids)


def attention_rule(config) -> tuple[bool, int | None]:
    """The one (causal, window) rule shared by all draft layers; the flattened training layout
    passes a single mask to every layer, so mixed per-layer rules are refused."""
    rules = {(config.layer_is_causal(i), config.layer_window(i)) for i in range(config.num_hidden_layers)}
    if len(rules) != 1:
        raise ValueError(f"draft layers mix attention rules {sorted(rules, key=str)} (layer_types / is_causal); "
                         "training supports one rule for all layers: set is_causal and layer_types uniformly")
    return rules.pop()


def dense_mask(layout: BlockLayout, doc_ids: torch.Tensor, position_ids: torch.Tensor, config) -> torch.Tensor:
    """Explicit bool mask `[Bt, 1, Q, S + Q]` (True = attend) for the CPU / SDPA path."""
    causal, window = attention_rule(config)
    Bt, A, Bk = layout.block_ids.shape
    S, Q, dev = doc_ids.shape[1], A * Bk, doc_ids.device
    qb = torch.arange(Q, device=dev) // Bk                       # [Q] block of each query
    a = layout.anchors[:, qb]                                    # [Bt, Q]
    d = layout.anchor_doc[:, qb]
    k = torch.arange(S, device=dev)
    ctx = (k[None, None, :] < a[:, :, None]) & (doc_ids[:, None, :] == d[:, :, None])   # [Bt, Q, S]
    blk = qb[:, None] == qb[None, :]                             # [Q, Q]
    if causal:
        qi = torch.arange(Q, device=dev) % Bk
        blk = blk & (qi[:, None] >= qi[None, :])
    blk = blk[None].expand(Bt, -1, -1)
    if window is not None:
        pq = layout.block_pos.flatten(1)                         # [Bt, Q]
        ctx = ctx & ((pq[:, :, None] - position_ids[:, None, :]).abs() < window)
        blk = blk & ((pq[:, :, None] - pq[:, None, :]).abs() < window)
    return torch.cat([ctx, blk], dim=-1)[:, None]


def flex_block_mask(layout: BlockLayout, doc_ids: torch.Tensor, position_ids: torch.Tensor, config,
                    *, compile: bool = False):
    """The same mask as `dense_mask`, as a FlexAttention `BlockMask` (block-sparse; the CUDA path).

    `compile=True` builds the block mask with a compiled kernel (CUDA); eager works anywhere.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    causal, window = attention_rule(config)
    Bt, A, Bk = layout.block_ids.shape
    S, Q = doc_ids.shape[1], A * Bk
    pad = torch.full((Bt, Q), -3, dtype=doc_ids.dtype, device=doc_ids.device)
    doc_kv = torch.cat([doc_ids, pad], dim=1)                    # [Bt, S+Q], blocks never match a doc
    pos_kv = torch.cat([position_ids, layout.block_pos.flatten(1)], dim=1)
    pos_q = layout.block_pos.flatten(1)
    anchors, adoc = layout.anchors, layout.anchor_doc

    def mask_mod(b, h, q_idx, kv_idx):
        blk = q_idx // Bk
        is_ctx = kv_idx < S
        ctx_ok = (kv_idx < anchors[b, blk]) & (doc_kv[b, kv_idx] == adoc[b, blk])
        kb = (kv_idx - S) // Bk
        blk_ok = kb == blk
        if causal:
            blk_ok = blk_ok & ((kv_idx - S) % Bk <= q_idx % Bk)
        ok = torch.where(is_ctx, ctx_ok, blk_ok)
        if window is not None:
            ok = ok & ((pos_q[b, q_idx] - pos_kv[b, kv_idx]).abs() < window)
        return ok

    return create_block_mask(mask_mod, B=Bt, H=None, Q_LEN=Q, KV_LEN=S + Q, device=doc_ids.device,
                             _compile=compile)
