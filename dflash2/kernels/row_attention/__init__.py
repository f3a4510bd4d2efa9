"""Per-row masked GQA attention over the engine's static K/V cache (`dflash2.engine.cache`).

The torch reference is SDPA with an explicit `[B, 1, q, kv]` mask. The Triton kernel reads each
key block once per K/V head for all the group's query heads and queries, builds no mask tensor
(visibility comes from the positions), skips keys past a row's last position, and splits the
keys over programs so that a batch of one still fills the GPU (flash-decoding). Timings against
the reference: `docs/PERFORMANCE.md`, "Kernels".
"""

from __future__ import annotations

import torch

from dflash2.kernels.row_attention.reference import row_attention_reference, visible_mask

try:
    from dflash2.kernels.row_attention import triton_kernels as _tk
except ImportError:  # triton missing: only impl="torch" works (resolve_impl says so)
    _tk = None

__all__ = ["row_attention", "row_attention_reference", "visible_mask", "split_count", "kernel_fits", "head_group",
           "MAX_TILE_ROWS"]

MAX_TILE_ROWS = 64  # query heads per K/V head x queries: decode and verify blocks, not prompts
_BLOCK_N = 64
_PROGRAMS = 264  # about two programs per SM on an H200 (132 SMs)
# Splits per tile are capped at this many tile rows over the tile's rows: a 64-row tile (16 queries
# x 4 heads) walks at least a quarter of the keys per program. The value is a tuning choice the
# sweeps leave open (at batch 1 they have ranked 4 to 9 splits differently from run to run);
# `python -m benchmarks.kernels --batches 1 8 --sweep --sweep-kernels row_attention` re-measures it.
_SPLIT_TILE_ROWS = 256
# The merge's programs: blocks of 16 tile rows x 32 head dims, so the 8B target at batch 1 gets 32
# (decode) to 128 (16-token verify) programs and SmolLM2 6, where one program per (row, K/V head)
# would give 8 and 3, too few programs to fill the GPU.
_MERGE_R, _MERGE_D = 16, 32


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def head_group(heads: int, kv_heads: int, tile: int) -> int:
    """Query heads per program for a query tile of `tile` slots: the whole group of `heads /
    kv_heads` when it fits `MAX_TILE_ROWS` tile rows, else as many as fit (0: not even one head)."""
    g = heads // kv_heads
    return g if g * tile <= MAX_TILE_ROWS else MAX_TILE_ROWS // tile


def kernel_fits(heads: int, kv_heads: int, queries: int, head_dim: int, *, head_groups: bool = False) -> bool:
    """Whether the Triton kernel takes this shape: a tile of (query heads per K/V head) x queries
    of at most `MAX_TILE_ROWS` rows (decode / verify blocks, not prompts) and a power-of-two head
    dimension of at least 16. `head_groups=True`: the kernel may also split a K/V head's query
    heads over programs (`head_group`), so one head x queries must fit (exact mode's invariant
    path, where the query tile is the drafter's block). Callers route other shapes to the reference."""
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads or head_dim < 16 or head_dim & (head_dim - 1):
        return False
    per_program = head_group(heads, kv_heads, queries)
    return per_program == heads // kv_heads or (head_groups and per_program > 0)


def split_count(batch: int, kv_heads: int, kv_len: int, block_n: int = _BLOCK_N, programs: int = _PROGRAMS,
                tile_rows: int = 16) -> int:
    """Key splits per (row, K/V head): enough programs to fill the GPU, at least a block each, and
    at most `_SPLIT_TILE_ROWS / tile_rows` (a tall tile does more work per key block, and each split
    adds a partial for the merge to read)."""
    blocks = max(1, -(-kv_len // block_n))
    return max(1, min(blocks, programs // max(1, batch * kv_heads), _SPLIT_TILE_ROWS // max(1, tile_rows)))


def _check_split_keys(split_keys: int, block_n: int) -> None:
    """Raise unless `split_keys` is a positive multiple of the key block `block_n`."""
    if isinstance(split_keys, bool) or not isinstance(split_keys, int) or split_keys <= 0 or split_keys % block_n:
        raise ValueError(f"split_keys must be a positive multiple of the key block {block_n}, got {split_keys!r}")


def _row_attention_triton(query, key, value, positions, window, scale, splits=None, block_n=_BLOCK_N,
                          num_warps=4, split_keys=None, tile_queries=None, merge_block=(_MERGE_R, _MERGE_D),
                          merge_unroll=False):
    """The Triton path; `splits`, `block_n` and `num_warps` are tiling knobs (the defaults are the
    engine's; `python -m benchmarks.kernels --sweep` times alternatives). `split_keys` fixes the
    split boundaries instead (`row_attention` states the guarantee); it excludes `splits`.
    `merge_block` = (tile rows, head dims) per merge program, each capped at the tile and the head
    dimension: it spreads the merge over programs and never changes a bit of the result; nor does
    `merge_unroll` (the merge's split loop unrolled at compile time, so its loads can run ahead)."""
    b, nh, q, hd = query.shape
    nkv, kv = key.shape[1], key.shape[2]
    if nh % nkv:
        raise ValueError(f"{nh} query heads are not a multiple of {nkv} K/V heads")
    if hd < 16 or hd & (hd - 1):
        raise ValueError(f"head_dim {hd}: the Triton kernel needs a power of two >= 16; use impl='torch'")
    g = nh // nkv
    if tile_queries is None and q > MAX_TILE_ROWS:
        raise ValueError(f"{q} queries > {MAX_TILE_ROWS} tile rows: without tile_queries the Triton kernel is for "
                         "decode / verify blocks; use impl='torch' or a query tile for prompts")
    if tile_queries is not None and not 1 <= tile_queries <= MAX_TILE_ROWS:
        raise ValueError(f"tile_queries={tile_queries}: must be 1..{MAX_TILE_ROWS} (one query head of a tile "
                         f"in {MAX_TILE_ROWS} tile rows)")
    tile = q if tile_queries is None else tile_queries
    # A block that fits the tile is one tile of q queries; a longer one (a prompt) runs in tiles of `tile`.
    q_tile, n_tiles = (q, 1) if q <= tile else (tile, -(-q // tile))
    gc = head_group(nh, nkv, tile)
    nch = -(-g // gc)
    m = max(16, _next_pow2(gc * tile))
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    pos = positions.to(device=query.device, dtype=torch.long)
    if pos.dim() != 2 or pos.shape[-1] != q or pos.shape[0] not in (1, b):
        raise ValueError(f"positions {tuple(pos.shape)} do not match queries [B={b}, q={q}]")
    if split_keys is not None:
        _check_split_keys(split_keys, block_n)
        if splits is not None:
            raise ValueError("pass splits or split_keys, not both")
        chunk = split_keys  # boundaries at slots 0, split_keys, 2 * split_keys, ... whatever B and kv
    else:
        splits = splits or split_count(b, nkv, kv, block_n, tile_rows=m)
        chunk = -(-kv // splits)
        chunk = -(-chunk // block_n) * block_n
    splits = max(1, -(-kv // chunk))
    dev = query.device
    acc = torch.empty(b * n_tiles * nkv * nch * splits * m, hd, dtype=torch.float32, device=dev)
    mx = torch.empty(b * n_tiles * nkv * nch * splits * m, dtype=torch.float32, device=dev)
    sm = torch.empty_like(mx)
    out = torch.empty(b, q, nh, hd, dtype=query.dtype, device=dev)
    common = dict(NKV=nkv, G=g, GC=gc, NCH=nch, Q=q_tile, HD=hd, M=m, SPLITS=splits)
    programs = b * n_tiles * nkv * nch
    _tk._row_attn_split_kernel[(programs, splits)](
        query, key, value, pos, acc, mx, sm, kv, chunk, float(scale if scale is not None else hd ** -0.5), q, n_tiles,
        query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), pos.stride(0) if pos.shape[0] > 1 else 0, pos.stride(1),
        BLOCK_N=block_n, WINDOW=int(window or 0), IEEE=query.dtype == torch.float32, num_warps=num_warps, **common)
    merge_r, merge_d = min(merge_block[0], m), min(merge_block[1], hd)
    if merge_r <= 0 or merge_d <= 0 or merge_r & (merge_r - 1) or merge_d & (merge_d - 1):
        raise ValueError(f"merge_block={merge_block}: both must be positive powers of two")
    _tk._row_attn_merge_kernel[(programs, m // merge_r, hd // merge_d)](
        acc, mx, sm, out, out.stride(0), out.stride(1), out.stride(2), q, n_tiles,
        FIXED_SPLITS=split_keys is not None, MERGE_R=merge_r, MERGE_D=merge_d, UNROLL=bool(merge_unroll),
        num_warps=4, **common)
    return out


def row_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor,
                  window: int | None = None, scale: float | None = None, *, impl: str = "torch",
                  visible: torch.Tensor | None = None, split_keys: int | None = None,
                  tile_queries: int | None = None) -> torch.Tensor:
    """Masked GQA attention of `query [B, nh, q, hd]` over `key/value [B, nkv, kv, hd]`.

    Key slot `j` is visible to query `i` of row `b` iff `j <= positions[b, i]` (and, with a
    `window`, `j > positions[b, i] - window`). Every query must see at least one key.

    Args:
        impl: `"torch"` (SDPA with the mask; `visible` may pass a prebuilt one) or `"triton"`
            (already resolved, `dflash2.kernels.dispatch.resolve_impl`).
        split_keys: None (default): the Triton path splits the keys over `split_count(B, nkv, kv)`
            programs, so a row's result (the order its keys' partial sums combine in) changes with
            the batch size and the K/V length. An int, a positive multiple of the key block (64;
            anything else raises ValueError): every split covers exactly `split_keys` slots from
            slot 0, `ceil(kv / split_keys)` splits, merged one after another in split order; a split
            no query of a row sees leaves that row's merge untouched bit for bit. Then, at fixed
            `nh`, `nkv`, `q`, `hd`, dtype and `window` (the query tile depends on `q`), row `b`'s
            output depends only on row `b`'s query, keys, values and positions: not on `B`, not on
            the other rows, and not on the slots past its last position (nor on `kv`, so a longer
            buffer gives the same bits). The torch path takes no splits: it checks the value and
            ignores it (SDPA promises no such invariance).
        tile_queries: None (default): the query tile holds the block's `q` queries (at most
            `MAX_TILE_ROWS` of them). An int (1 to `MAX_TILE_ROWS`): the tile holds that many
            query slots whatever `q` is, the rest masked, and a block of more queries (a prompt)
            runs in `ceil(q / tile_queries)` such tiles, one program row each; so with `split_keys`
            a query's output also does not depend on `q` or on its slot in the block (each tile row
            runs the same products in the same order): a one-token decode gives the bits of the
            same token verified in a block of up to `tile_queries`, or prefilled in a prompt of any
            length. Triton path only; the torch path ignores it.
    A K/V head's query heads share one tile while (nh / nkv) x tile fits `MAX_TILE_ROWS` rows; past
    that they are split over programs, `head_group(nh, nkv, tile)` heads each. Which program and
    tile row a query head gets depends only on nh, nkv and the tile, so the guarantees above hold
    with the groups too, and a shape that fits one tile runs exactly the ops it ran without them.
    Returns:
        `[B, q, nh, hd]`.
    """
    if split_keys is not None:
        _check_split_keys(split_keys, _BLOCK_N)
    if impl == "torch":
        return row_attention_reference(query, key, value, positions, window, scale, visible=visible)
    if impl != "triton":
        raise ValueError(f"impl must be a resolved 'torch' or 'triton', got {impl!r}")
    if _tk is None:
        raise RuntimeError("impl='triton' needs the triton package; use impl='torch'")
    return _row_attention_triton(query, key, value, positions, window, scale, split_keys=split_keys,
                                 tile_queries=tile_queries)
