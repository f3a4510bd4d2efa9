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
    """Where one cached forward into `cache` writes each layer's keys and values, per row, for `c`
    new context entries of which `counts [B]` are valid and a block of `q`: `ctx [B, c]`, the
    context entries at the row's length on; `blk [B, q]`, the block right after the row's valid
    entries, from `first_blk [B]` on (over the context's padding entries, which the block overwrites);
    and `both [B, c + q]`, the two in that order for one write of both, with each padding entry
    pointed at the cache's trash slot `max_len` (`DraftContextCache`: never read), so that no
    entry shares a readable slot with another of its row and the cache ends, in slots
    `0 .. max_len - 1`, as the context write followed by the block write leaves it."""

    def __init__(self, cache: DraftContextCache, counts: torch.Tensor, first_blk: torch.Tensor, c: int, q: int):
        self.ctx = cache.slots_for(c)
        self.blk = first_blk[:, None] + cache.arange(q)
        self._cache, self._counts = cache, counts

    @functools.cached_property
    def both(self) -> torch.Tensor:
        valid = self._cache.arange(self.ctx.shape[1])[None] < self._counts[:, None]
        return torch.cat([torch.where(valid, self.ctx, self._cache.max_len), self.blk], dim=1)


class DraftContextCache:
    """Per-layer buffers `k, v [B, nkv, max_len + 1, hd]` and `lengths [B]` (int64). Slots
    `0 .. max_len - 1` hold entries; slot `max_len` is a trash slot that writes of padding entries
    may hit and that nothing reads (`readable` gives the attention its `max_len` slots). `positions`,
    `arange(max_len)` (slices of it replace per-step `arange` kernels); and optionally `rope`, the
    draft's RoPE table `[max_len, 2, hd]` (cos, sin at positions 0 .. max_len - 1, in the draft's
    dtype; `DFlash2DraftModel.rope_table`), so a step gathers its cos / sin instead of computing them."""

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
        rope: torch.Tensor | None = None,
    ):
        shape = (batch_size, num_kv_heads, max_len + 1, head_dim)  # + the trash slot
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.positions = torch.arange(max_len, device=device)
        if rope is not None and (rope.dim() != 3 or rope.shape[0] != max_len or rope.shape[1] != 2):
            raise ValueError(f"rope table must be [max_len={max_len}, 2, hd], got {tuple(rope.shape)}")
        self.rope = rope
        self.max_len = max_len

    @classmethod
    def for_model(cls, model, batch_size: int, max_len: int, *, dtype=None, device=None) -> DraftContextCache:
        cfg = model.config
        p = next(model.parameters())
        device = device or p.device
        table = getattr(model, "rope_table", None)
        rope = table(max_len, p.dtype, device) if table is not None else None
        return cls(cfg.num_hidden_layers, batch_size, max_len, cfg.num_key_value_heads, cfg.head_dim,
                   dtype=dtype or p.dtype, device=device, rope=rope)

    def rope_at(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(cos, sin)`, each `[B, S, hd]` (views of one gather), at `position_ids [B, S]` from the
        table, or None without a table in `dtype`. Positions are clamped into the table: an entry
        past it is a padding entry, whose keys go to the trash slot or are overwritten."""
        if self.rope is None or self.rope.dtype != dtype:
            return None
        rows = self.rope[position_ids.clamp(0, self.max_len - 1)]  # [B, S, 2, hd]
        return rows[..., 0, :], rows[..., 1, :]

    def readable(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer_idx`'s keys and values without the trash slot, `[B, nkv, max_len, hd]` views."""
        return self.keys[layer_idx][:, :, :self.max_len], self.values[layer_idx][:, :, :self.max_len]

    def reset(self) -> None:
        self.lengths.zero_()

    def slots_for(self, num_new: int) -> torch.Tensor:
        """Slot indices `[B, num_new]` where the next `num_new` entries of each row go."""
        return self.lengths[:, None] + self.arange(num_new)

    def arange(self, n: int) -> torch.Tensor:
        """`arange(n)` on the cache's device: a view of `positions` (no kernel) up to `max_len`."""
        return self.positions[:n] if n <= self.max_len else torch.arange(n, device=self.positions.device)

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
