"""Static, per-row target KV cache and the attention function that reads it.

The target runs as stock transformers modules; the engine owns its cache and its attention
through transformers' public extension points:

- `StaticTargetCache` is a `transformers.Cache` whose layers (`RowStaticLayer`) hold static
  buffers `[B, nkv, S_max, hd]`. Key/value slot `j` of row `b` always holds absolute position
  `j` of that row, so rows of different lengths share one buffer without padding tricks.
  Before each forward the engine calls `cache.prepare(positions)`; every layer then scatters
  its new K/V at `positions[b, i]`. Rolling back rejected tokens is only
  `cache.lengths[b] = committed_b`: slots past the length are overwritten before they are
  ever read again, because a query only sees slots up to its own position.
- `row_attention` is registered in `transformers.AttentionInterface` as `"dfl2_row_static"`.
  It masks per row: key slot `j` is visible to query `i` of row `b` iff
  `j <= positions[b, i]` (= `len_b + i`), and, on a sliding layer with window `W`, also
  `j > positions[b, i] - W` (the HF sliding-window convention). The kernel is
  `dflash2.kernels.row_attention`: SDPA with a mask (`"torch"`, and for prompts), or a split-key
  GQA Triton kernel that needs no mask (`"triton"`, the engine's default on CUDA). The choice,
  exact mode and the masks come with each forward as attention kwargs that the engine builds from
  its settings (`StaticTargetCache.attention_kwargs`: `dfl2_kernel`, `dfl2_exact`, `dfl2_masks`,
  the masks built once per forward for all layers); no context variable or thread-local is read.
  The positions come from the `position_ids` kwarg, which stock Qwen3/Llama decoder layers
  forward to the attention function. We deliberately do *not* register a mask function in `AttentionMaskInterface`:
  for an implementation name missing there, `masking_utils` returns no mask at all
  (`_preprocess_mask_arguments` early exit), so HF never builds a `[B, 1, q, kv]` mask of
  its own and the cache's `get_mask_sizes` is never consulted.

`static_attention(model)` switches a model to this attention for the duration of a
`with` block (via `set_attn_implementation`) and restores the previous implementation (once the
last of overlapping calls leaves).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

from dflash2.kernels.row_attention import kernel_fits, visible_mask
from dflash2.kernels.row_attention import row_attention as row_attention_kernel

# The name must not contain "flash": transformers treats any such name as a FlashAttention
# kernel request (`is_flash_attention_requested` is a substring test) and tries to load it.
ATTN_IMPLEMENTATION = "dfl2_row_static"
FULL_WINDOW = 0  # the `dfl2_masks` key of layers without a sliding window


class _RowState:
    """State shared by every layer of one `StaticTargetCache` (set once per forward)."""

    def __init__(self, batch_size: int, max_len: int, device: torch.device):
        self.max_len = max_len
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] committed K/V per row
        self.positions: torch.Tensor | None = None  # [B, q] write slots of the current forward
        self.kv_len = max_len  # slots handed to attention: buffer[..., :kv_len]
        self.span: tuple[int, int] | None = None  # set: the forward runs rows start..stop-1 (a view of the buffers)


class RowStaticLayer(CacheLayerMixin):
    """One layer's static K/V buffers `[B, nkv, S_max, hd]`; writes at per-row positions."""

    is_compileable = True
    is_sliding = False

    def __init__(self, state: _RowState, sliding_window: int | None = None):
        super().__init__()
        self.state = state
        self.max_cache_len = state.max_len
        # The buffer always keeps every position (the window is applied by the mask), so the
        # layer is not "sliding" in HF's storage sense even on a sliding-attention layer.
        self.sliding_window = sliding_window

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, nkv = key_states.shape[:2]
        s = self.max_cache_len
        self.keys = torch.zeros(b, nkv, s, key_states.shape[-1], dtype=self.dtype, device=self.device)
        self.values = torch.zeros(b, nkv, s, value_states.shape[-1], dtype=self.dtype, device=self.device)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter `key_states/value_states [B, nkv, q, hd]` at `state.positions [B, q]`."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        pos = self.state.positions
        if pos is None or pos.shape != (key_states.shape[0], key_states.shape[2]):
            raise RuntimeError(
                "StaticTargetCache.prepare(positions) must be called with positions [B, q] matching the "
                f"forward's keys {tuple(key_states.shape)} before running the model"
            )
        b, nkv, q, _ = key_states.shape
        span = self.state.span
        keys, values = (self.keys, self.values) if span is None else (self.keys[span[0]:span[1]],
                                                                      self.values[span[0]:span[1]])
        idx = pos[:, None, :, None].expand(b, nkv, q, keys.shape[-1])  # [B, nkv, q, hd]
        keys.scatter_(2, idx, key_states.to(self.dtype))
        idx_v = pos[:, None, :, None].expand(b, nkv, q, values.shape[-1])
        values.scatter_(2, idx_v, value_states.to(self.dtype))
        n = self.state.kv_len
        return keys[:, :, :n], values[:, :, :n]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.state.kv_len, 0

    def get_seq_length(self) -> int:
        # HF only asks this to invent position ids; the engine always passes its own.
        return int(self.state.lengths.max()) if self.state.lengths.numel() else 0

    def get_max_length(self) -> int:
        return self.max_cache_len

    def reset(self) -> None:
        if self.is_initialized:
            self.keys.zero_()
            self.values.zero_()


def attention_heads(config) -> tuple[int, int, int]:
    """`(query heads, K/V heads, head dim)` of a transformers decoder config (K/V heads default
    to the query heads, the head dim to hidden_size / heads)."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return heads, kv_heads, head_dim


class StaticTargetCache(Cache):
    """Engine-owned target cache: static buffers, per-row lengths, rollback = set lengths.

    Args:
        config: the target's HF config (`num_hidden_layers`, `layer_types`, `sliding_window`,
            `num_key_value_heads`, `head_dim`).
        batch_size: rows `B`.
        max_len: slots per row `S_max` (prompt + generated + one block of slack).
        dtype, device: buffer dtype/device (the target's).
    """

    def __init__(self, config, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | str):
        device = torch.device(device)
        self.state = _RowState(batch_size, max_len, device)
        n_layers = config.num_hidden_layers
        layer_types = getattr(config, "layer_types", None) or ["full_attention"] * n_layers
        window = getattr(config, "sliding_window", None)
        layers = [
            RowStaticLayer(self.state, window if t == "sliding_attention" else None) for t in layer_types[:n_layers]
        ]
        super().__init__(layers=layers)
        self.heads = attention_heads(config)  # query heads, K/V heads, head dim
        nkv, hd = self.heads[1:]
        self.windows = sorted({layer.sliding_window or FULL_WINDOW for layer in layers})
        self.early_initialization(batch_size, nkv, hd, dtype, device)

    @property
    def lengths(self) -> torch.Tensor:
        """`[B]` int64: committed K/V slots per row (writable in place)."""
        return self.state.lengths

    @property
    def max_len(self) -> int:
        return self.state.max_len

    def prepare(self, positions: torch.Tensor, kv_len: int | None = None, row: int | None = None,
                rows: int | None = None, start: int = 0) -> None:
        """Set the write slots `positions [B, q]` of the next forward.

        `kv_len` (host int, default `S_max`) bounds the key slots handed to attention; it must
        exceed every position written or read. A fixed `S_max` keeps shapes static (graph
        capture); a tighter bound is cheaper in eager mode. `row`: the next forward is row `row`
        alone (`positions [1, q]`); it reads and writes only that row's buffers, with exactly
        the shapes of a batch of one (exact mode). `rows`: the next forward is rows
        `start..start+rows-1` (`positions [rows, q]`; the graph path's batch buckets prefill only
        the real rows, exact mode's prefill a group of rows at a time).
        """
        n = self.state.lengths.numel()
        if row is not None and not 0 <= row < n:
            raise ValueError(f"row={row} is outside the cache's {n} rows")
        if rows is not None and (row is not None or not 0 < rows or not 0 <= start <= n - rows):
            raise ValueError(f"rows={rows} from row {start}: must lie in the cache's {n} rows, not combined with "
                             "row")
        if start and rows is None:
            raise ValueError("start needs rows")
        self.state.positions = positions
        self.state.kv_len = self.state.max_len if kv_len is None else min(int(kv_len), self.state.max_len)
        self.state.span = (row, row + 1) if row is not None else (None if rows is None else (start, start + rows))

    def attention_kwargs(self, kernel: str, exact: bool = False, split_keys: int | None = None,
                         tile_queries: int | None = None) -> dict:
        """The attention kwargs of the forward just `prepare`d, for `row_attention`: the resolved
        kernel (`"torch" | "triton"`), exact mode, and, where the forward takes the mask path
        (the torch kernel, exact mode on CUDA, or shapes the Triton kernel refuses, such as
        prompts), the visibility masks `{window or FULL_WINDOW: [B, q, kv] bool}` built here once
        for every layer of the forward. `split_keys`: the Triton kernel with key splits of that
        many slots at fixed absolute boundaries (invariant exact mode), whatever `kernel` says;
        the forward's shapes must fit it; `tile_queries` then fixes its query tile (a block of any
        width gives each query the same bits, a prompt included: `dflash2.kernels.row_attention`)."""
        pos = self.state.positions
        if pos is None:
            raise RuntimeError("StaticTargetCache.prepare(positions) must come before attention_kwargs")
        b, q = pos.shape
        if split_keys is not None:  # a block longer than the tile (a prompt) runs in query tiles
            tile = q if tile_queries is None else int(tile_queries)
            if not kernel_fits(*self.heads[:2], tile, self.heads[2], head_groups=True):
                raise ValueError(f"split_keys needs the Triton row-attention kernel, which does not take "
                                 f"{self.heads[0]}/{self.heads[1]} heads x {q} queries (tile {tile}) x head_dim "
                                 f"{self.heads[2]}")
            return {"dfl2_kernel": "triton", "dfl2_exact": False, "dfl2_split_keys": int(split_keys),
                    "dfl2_tile_queries": tile_queries}
        kw = {"dfl2_kernel": kernel, "dfl2_exact": exact}
        if kernel == "triton" and not (exact and pos.is_cuda) and kernel_fits(*self.heads[:2], q, self.heads[2]):
            return kw
        kv = self.state.kv_len
        kw["dfl2_masks"] = {w: visible_mask(pos, b, q, kv, w or None) for w in self.windows}
        return kw

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy, in every layer, row b's K/V at slots `src [B, m]` to slots `dst [B, m]` (all read
        before any is written, so sources may overlap destinations; an entry with `src == dst` is a
        no-op). Tree verify commits its accepted path this way (`dflash2.engine.tree`)."""
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            for buf in (layer.keys, layer.values):
                b, nkv, _, hd = buf.shape
                idx_src = src[:, None, :, None].expand(b, nkv, src.shape[1], hd)
                idx_dst = dst[:, None, :, None].expand(b, nkv, dst.shape[1], hd)
                buf.scatter_(2, idx_dst, buf.gather(2, idx_src))

    def set_lengths(self, lengths: torch.Tensor) -> None:
        """Commit/rollback: row `b` keeps slots `< lengths[b]` (no data moves)."""
        self.state.lengths.copy_(lengths)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[0].get_seq_length() if self.layers else 0


def row_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    position_ids: torch.Tensor | None = None,
    dfl2_kernel: str = "torch",
    dfl2_exact: bool = False,
    dfl2_masks: dict[int, torch.Tensor] | None = None,
    dfl2_split_keys: int | None = None,
    dfl2_tile_queries: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Per-row masked attention over the static cache (registered as `"dfl2_row_static"`).

    Args:
        query: `[B, nh, q, hd]`; key/value: `[B, nkv, kv, hd]` (the cache buffers, slot = position).
        attention_mask: must be None (no mask function is registered for this implementation).
        sliding_window: the layer's window (Qwen3 passes it; else `module.sliding_window`).
        position_ids: `[B, q]` (or `[1, q]`) absolute positions of the queries.
        dfl2_kernel, dfl2_exact, dfl2_masks: the call's kernel, exact mode, and the forward's
            masks (`StaticTargetCache.attention_kwargs`); a mask missing there is built here.
        dfl2_split_keys: the Triton kernel with key splits at fixed absolute slots of this size
            (invariant exact mode: a row's output does not depend on the batch or the K/V length).
        dfl2_tile_queries: with `dfl2_split_keys`, the kernel's fixed query tile (nor on the block width).

    Returns:
        `([B, q, nh, hd], None)`, like the stock attention functions.
    """
    if position_ids is None:
        raise RuntimeError(
            f"{ATTN_IMPLEMENTATION} attention needs `position_ids` in the attention kwargs; this model's "
            "decoder layers do not forward them (supported: Qwen3 and Llama families)"
        )
    if attention_mask is not None:
        raise RuntimeError(f"{ATTN_IMPLEMENTATION} builds its own per-row mask; got an HF mask as well")
    b, nh, q, _ = query.shape
    window = sliding_window if sliding_window is not None else getattr(module, "sliding_window", None)
    if dfl2_split_keys is not None:
        return row_attention_kernel(query, key, value, position_ids, window, scaling, impl="triton",
                                    split_keys=dfl2_split_keys, tile_queries=dfl2_tile_queries), None
    exact = query.is_cuda and dfl2_exact
    # The Triton kernel takes decode / verify blocks (no mask tensor: visibility comes from the
    # positions); prompts go through SDPA.
    if not exact and dfl2_kernel == "triton" and kernel_fits(nh, key.shape[1], q, query.shape[-1]):
        return row_attention_kernel(query, key, value, position_ids, window, scaling, impl="triton"), None
    visible = None if dfl2_masks is None else dfl2_masks.get(window or FULL_WINDOW)
    if visible is None or visible.shape != (b, q, key.shape[2]):
        visible = visible_mask(position_ids.to(query.device), b, q, key.shape[2], window)
    nkv = key.shape[1]
    if exact:
        # Exact mode: the memory-efficient kernel walks the keys of each (row, head, query tile)
        # in one sequential loop, so a row's result depends neither on its batch neighbours nor on
        # a masked key tail; the default choice on Hopper (cuDNN) picks shape-dependent plans
        # whose rows changed with the batch in bf16. GQA heads are expanded (exact copies) since
        # that kernel takes equal head counts.
        if nh != nkv:
            key = key.repeat_interleave(nh // nkv, dim=1)
            value = value.repeat_interleave(nh // nkv, dim=1)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=visible[:, None], scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    # Inference only (the engine never trains the target): no dropout.
    return row_attention_kernel(query, key, value, position_ids, window, scaling, impl="torch", visible=visible), None


# Registered behind `torch.compiler.disable`: with `compile_level="full"` (dflash2.engine.compiled)
# everything around the attention call is compiled, and the call itself stays this eager SDPA
# (under Inductor a masked SDPA over symbolic shapes ran slower at one query per row on the H200).
AttentionInterface.register(ATTN_IMPLEMENTATION, torch.compiler.disable(row_attention))


_SWITCH_LOCK = threading.Lock()
_USERS = "_dflash2_static_attention_users"  # on the HF model: (calls inside static_attention, previous impl)


@contextlib.contextmanager
def static_attention(model) -> Iterator[None]:
    """Run `model` (an HF `PreTrainedModel`) with `"dfl2_row_static"` attention inside the block.

    Calls that overlap (two threads on one model) share the switch: the first one in sets the
    implementation, the last one out restores the previous one, so no call's forward ever runs
    with another call's restore in between."""
    with _SWITCH_LOCK:
        users, previous = model.__dict__.get(_USERS, (0, None))
        if users == 0:
            previous = model.config._attn_implementation
            if previous != ATTN_IMPLEMENTATION:
                model.set_attn_implementation(ATTN_IMPLEMENTATION)
                if model.config._attn_implementation != ATTN_IMPLEMENTATION:
                    raise RuntimeError(
                        f"{type(model).__name__} refused attn_implementation={ATTN_IMPLEMENTATION!r}; the engine "
                        "needs a model whose attention goes through transformers' AttentionInterface")
        model.__dict__[_USERS] = (users + 1, previous)
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            users, previous = model.__dict__.pop(_USERS)
            if users > 1:
                model.__dict__[_USERS] = (users - 1, previous)
            elif previous != ATTN_IMPLEMENTATION:
                model.set_attn_implementation(previous)
