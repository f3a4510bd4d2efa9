"""Static-shape context K/V cache of the draft (spec 2.8).

Only context K/V persist: one entry per committed token whose target features exist, at slot
index = absolute position (row b's context occupies slots `0 .. lengths[b]-1`). Block K/V are
recomputed every step and never stored, which is the z-lab "crop back to start" rule without
a crop. Rows grow independently: a forward writes all `c` new entries of every row at the
row's own offset, then advances each row by its `context_lengths[b]`; entries past a row's
length are garbage that later writes overwrite and the attention mask never shows.
"""

from __future__ import annotations

import functools

import torch


class StepSlots:
    """Where one cached forward writes each layer's keys and values, per row: `ctx [B, c]`, the
    new context entries at the row's length on; `blk [B, q]`, the block right after the row's
    `counts [B]` valid entries (over the context's padding entries, which the block overwrites);
    and `both [B, c + q]`, the two in that order for one write of both, with each padding entry
    pointed at slot `max_len`, past the cache (a write there is dropped), so that no two entries
    of a row share a slot and the cache ends as the context write followed by the block write
    leaves it in slots `0 .. max_len - 1`."""

    def __init__(self, ctx: torch.Tensor, blk: torch.Tensor, counts: torch.Tensor, max_len: int):
        self.ctx, self.blk, self.counts, self.max_len = ctx, blk, counts, max_len

    @functools.cached_property
    def both(self) -> torch.Tensor:
        valid = torch.arange(self.ctx.shape[1], device=self.ctx.device)[None] < self.counts[:, None]
        return torch.cat([torch.where(valid, self.ctx, self.max_len), self.blk], dim=1)


class DraftContextCache:
    """Per-layer buffers `k, v [B, nkv, max_len, hd]` and `lengths [B]` (int64)."""

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.max_len = max_len

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, *, dtype=None, device=None) -> "DraftContextCache":
        cfg = model.config
        p = next(model.parameters())
        return cls(cfg.num_hidden_layers, batch_size, max_len, cfg.num_key_value_heads, cfg.head_dim,
                   dtype=dtype or p.dtype, device=device or p.device)

    def reset(self) -> None:
        self.lengths.zero_()

    def slots_for(self, num_new: int) -> torch.Tensor:
        """Slot indices `[B, num_new]` where the next `num_new` entries of each row go."""
        return self.lengths[:, None] + torch.arange(num_new, device=self.lengths.device)

    def write(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Scatter `k, v [B, nkv, c, hd]` into each row at `slots [B, c]`.

        Slots past `max_len` would be dropped silently by a plain index op, so they are checked
        by the caller once per forward (`check_capacity`), not per layer.
        """
        idx = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        self.keys[layer_idx].scatter_(2, idx, k.to(self.keys[layer_idx].dtype))
        self.values[layer_idx].scatter_(2, idx, v.to(self.values[layer_idx].dtype))

    def check_capacity(self, num_new: int, block_end: torch.Tensor | None = None) -> None:
        """Raise unless `num_new` context entries (and, given `block_end [B]`, a block written up to
        slot `block_end - 1`) fit every row."""
        # One host sync. Under CUDA-graph capture (no sync allowed) it is skipped: the engine
        # sizes max_len for prompt + max_new_tokens + a block up front, which bounds every write.
        if self.lengths.is_cuda and torch.cuda.is_current_stream_capturing():
            return
        need = self.lengths + num_new
        if block_end is not None:
            need = torch.maximum(need, block_end)
        need = int(need.max())
        if need > self.max_len:
            raise RuntimeError(f"DraftContextCache overflow: a row needs {need} slots but max_len is "
                               f"{self.max_len}; allocate the cache for prompt + max_new_tokens + block")

    def advance(self, context_lengths: torch.Tensor) -> None:
        self.lengths += context_lengths.to(self.lengths)
