"""Per-row masked GQA attention (`dflash2.kernels.row_attention`): the SDPA reference against an
explicit fp64 softmax, and the split-key Triton kernel against the reference (interpreter on
CPU, compiled on a GPU), over GQA groups, windows, key splits, strided views of the cache; with
fixed key splits (`split_keys`), a row's bits alone vs in a batch and over a longer K/V buffer, and
with a fixed query tile (`tile_queries`) a query's bits alone vs in blocks of every width."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.row_attention import MAX_TILE_ROWS, _row_attention_triton, head_group, kernel_fits, \
    row_attention, row_attention_reference, split_count


def _explicit(q, k, v, pos, window):
    """fp64 softmax over the visible slots, written out: [B, q, nh, hd]."""
    b, nh, nq, hd = q.shape
    g = nh // k.shape[1]
    out = torch.zeros(b, nq, nh, hd, dtype=torch.float64)
    for bi in range(b):
        for h in range(nh):
            for i in range(nq):
                p = int(pos[bi if pos.shape[0] > 1 else 0, i])
                lo = max(0, p - window + 1) if window else 0
                keys = k[bi, h // g, lo:p + 1].double()
                w = torch.softmax(keys @ q[bi, h, i].double() / hd ** 0.5, dim=0)
                out[bi, i, h] = w @ v[bi, h // g, lo:p + 1].double()
    return out


def _case(b, nh, nkv, nq, hd, slots, kv, device, dtype=torch.float32):
    """Queries as a transposed view, K/V as the first `kv` slots of larger buffers (the cache's
    layout), rows at different positions (row 0 at the end of the keys)."""
    buf_k = torch.randn(b, nkv, slots, hd, dtype=dtype).to(device)
    buf_v = torch.randn(b, nkv, slots, hd, dtype=dtype).to(device)
    q = torch.randn(b, nq, nh, hd, dtype=dtype).to(device).transpose(1, 2)
    start = torch.randint(0, kv - nq + 1, (b,))
    start[0] = kv - nq
    pos = (start[:, None] + torch.arange(nq)).to(device)
    return q, buf_k[:, :, :kv], buf_v[:, :, :kv], pos


@pytest.mark.parametrize("window", [None, 5])
def test_reference_matches_explicit_softmax(window):
    q, k, v, pos = _case(2, 4, 2, 3, 8, 30, 24, "cpu", torch.float64)
    got = row_attention_reference(q, k, v, pos, window)
    assert torch.allclose(got, _explicit(q, k, v, pos, window), atol=1e-10)


@pytest.mark.parametrize("b, nh, nkv, nq, hd, kv, window, splits", [
    (2, 4, 2, 5, 16, 70, None, 3),    # GQA group 2, three key splits
    (2, 8, 2, 5, 16, 70, 7, None),    # group 4 (20 tile rows, padded to 32), sliding window
    (1, 4, 4, 1, 32, 33, None, 2),    # plain MHA, one query (AR decode)
    (3, 6, 2, 3, 16, 64, None, 1),    # one split over every block
    (2, 4, 1, 16, 16, 40, None, 2),   # a full verify block: 4 x 16 = 64 tile rows
])
def test_triton_matches_reference(b, nh, nkv, nq, hd, kv, window, splits, triton_device):
    q, k, v, pos = _case(b, nh, nkv, nq, hd, kv + 9, kv, triton_device)
    out = _row_attention_triton(q, k, v, pos, window, None, splits=splits)
    ref = row_attention_reference(q, k, v, pos, window)
    assert out.shape == (b, nq, nh, hd)
    assert torch.allclose(out, ref, atol=2e-5, rtol=1e-5), (out - ref).abs().max()


@pytest.mark.parametrize("block_n, num_warps, splits", [(32, 8, None), (16, 2, 5)])
def test_triton_tiling_knobs_keep_the_result(block_n, num_warps, splits, triton_device):
    """The tiling knobs the kernel bench sweeps (key block, warps, splits) change no result."""
    q, k, v, pos = _case(2, 8, 2, 4, 16, 90, 77, triton_device)
    out = _row_attention_triton(q, k, v, pos, None, None, splits=splits, block_n=block_n, num_warps=num_warps)
    assert torch.allclose(out, row_attention_reference(q, k, v, pos, None), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("split_keys", [None, 32], ids=["default_splits", "split_keys"])
def test_merge_blocks_change_no_bit(split_keys, triton_device):
    """The merge spread over blocks of tile rows and head dims (the default, and smaller ones), with
    its split loop unrolled or not, gives the bits of one merge program per (row, K/V head), (M, hd):
    every element runs the same ops in the same order. A merge block that is no power of two is
    refused."""
    q, k, v, pos = _case(2, 8, 2, 5, 32, 90, 77, triton_device)  # tile 4 heads x 5 queries: 32 rows
    kw = dict(splits=None if split_keys else 3, split_keys=split_keys, block_n=16)
    whole = _row_attention_triton(q, k, v, pos, None, None, merge_block=(32, 32), **kw)
    for block in [(16, 64), (16, 16), (8, 32), (1, 8)]:
        assert torch.equal(_row_attention_triton(q, k, v, pos, None, None, merge_block=block, **kw), whole), block
    for unroll in (False, True):
        assert torch.equal(_row_attention_triton(q, k, v, pos, None, None, merge_unroll=unroll, **kw), whole), unroll
    assert torch.allclose(whole, row_attention_reference(q, k, v, pos, None), atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="powers of two"):
        _row_attention_triton(q, k, v, pos, None, None, merge_block=(12, 32), **kw)


def test_triton_broadcast_positions_and_bf16(triton_device):
    if triton_device == "cpu":
        pytest.skip("bf16 dot products need the GPU")
    q, k, v, pos = _case(4, 8, 2, 4, 128, 600, 512, triton_device, torch.bfloat16)
    pos = pos[:1]  # one position row for the whole batch
    out = row_attention(q, k, v, pos, impl="triton")
    ref = row_attention_reference(q.float(), k.float(), v.float(), pos)
    assert (out.float() - ref).abs().max() < 2e-2


# Fixed splits at interpreter-sized shapes: key block 16, splits of 64 keys, 100 slots = 2 splits,
# the last one partial; 16 query heads over 8 K/V heads (3 queries: 6 of 16 tile rows). At these
# shapes the default split count depends on the batch and on kv, and moves the split boundaries:
# the tests check (unwindowed, once: the interpreter is slow) that the default changes the bits
# there, so they can fail.
_FIX = dict(nh=16, nkv=8, nq=3, hd=16, kv=100, block_n=16, split_keys=64)


def _fixed(q, k, v, pos, window):
    return _row_attention_triton(q, k, v, pos, window, None, block_n=_FIX["block_n"], split_keys=_FIX["split_keys"])


@pytest.mark.parametrize("window", [None, 20], ids=["full", "window20"])
def test_split_keys_row_is_batch_invariant(window, triton_device):
    """A row's output alone (B = 1) is bitwise the same as inside batches of 3 and 5 rows (the
    others random, at other positions), at the batch's start and in its middle."""
    nh, nkv, nq, hd, kv = (_FIX[n] for n in ("nh", "nkv", "nq", "hd", "kv"))
    q, k, v, pos = _case(1, nh, nkv, nq, hd, kv, kv, triton_device)
    alone = _fixed(q, k, v, pos, window)
    for b, at in [(3, 0), (5, 3)]:
        bq, bk, bv, bpos = _case(b, nh, nkv, nq, hd, kv, kv, triton_device)
        bq[at], bk[at], bv[at], bpos[at] = q[0], k[0], v[0], pos[0]
        assert torch.equal(_fixed(bq, bk, bv, bpos, window)[at], alone[0]), f"B={b}, row {at}"
    if window is None:  # control: the default's split count in five rows (6: 4 splits of 32 keys, not 7 of 16 as
        # alone) gives the row other bits (shown on the row alone with that count: the same layout)
        bn = _FIX["block_n"]
        in_five = _row_attention_triton(q, k, v, pos, None, None, splits=split_count(5, nkv, kv, bn), block_n=bn)
        assert not torch.equal(in_five, _row_attention_triton(q, k, v, pos, None, None, block_n=bn))


@pytest.mark.parametrize("window", [None, 20], ids=["full", "window20"])
def test_split_keys_ignores_slots_past_the_positions(window, triton_device):
    """The same rows over a K/V buffer longer by 2 splits + 17 slots (positions unchanged, the extra
    slots huge keys and NaN values): bitwise the same output, so the extra (dead) splits add
    nothing and the extra slots are never read."""
    nh, nkv, nq, hd, kv, sk = (_FIX[n] for n in ("nh", "nkv", "nq", "hd", "kv", "split_keys"))
    b, extra = 3, 2 * sk + 17
    q, k, v, pos = _case(b, nh, nkv, nq, hd, kv, kv, triton_device)
    k_long = torch.cat([k, 1e3 * torch.randn(b, nkv, extra, hd, device=triton_device)], dim=2)
    v_long = torch.cat([v, torch.full((b, nkv, extra, hd), float("nan"), device=triton_device)], dim=2)
    short = _fixed(q, k, v, pos, window)
    assert torch.isfinite(short).all()
    assert torch.equal(_fixed(q, k_long, v_long, pos, window), short)
    if window is None:  # control: in 3 rows the default asks 11 splits: 7 of 16 keys over 100 slots, 8 of 32
        # over 245, which changes the bits (shown on row 0 alone with that count: the same layout)
        v_long[:, :, kv:] = torch.randn(b, nkv, extra, hd, device=triton_device)  # finite: NaN != NaN
        n, bn = split_count(b, nkv, kv + extra, _FIX["block_n"]), _FIX["block_n"]
        outs = [_row_attention_triton(q[:1], kk[:1], vv[:1], pos[:1], None, None, splits=n, block_n=bn)
                for kk, vv in ((k, v), (k_long, v_long))]
        assert not torch.equal(*outs)


@pytest.mark.parametrize("b, nh, nkv, nq, hd, kv, window, block_n, split_keys", [
    (2, 4, 2, 5, 16, 70, None, 16, 32),    # GQA group 2, three splits, the last of 6 keys
    (2, 8, 2, 5, 16, 70, 7, 16, 16),       # group 4, a window: splits before it dead for row 0
    (1, 4, 4, 1, 32, 33, None, 16, 64),    # one query, one split larger than the keys
    (2, 4, 1, 16, 16, 200, None, 64, 64),  # a full verify block (64 tile rows), the default block
])
def test_split_keys_matches_reference(b, nh, nkv, nq, hd, kv, window, block_n, split_keys, triton_device):
    q, k, v, pos = _case(b, nh, nkv, nq, hd, kv + 9, kv, triton_device)
    if block_n == 64:  # the public entry point (its key block)
        out = row_attention(q, k, v, pos, window, impl="triton", split_keys=split_keys)
    else:
        out = _row_attention_triton(q, k, v, pos, window, None, block_n=block_n, split_keys=split_keys)
    ref = row_attention_reference(q, k, v, pos, window)
    assert out.shape == (b, nq, nh, hd)
    assert torch.allclose(out, ref, atol=2e-5, rtol=1e-5), (out - ref).abs().max()


@pytest.mark.parametrize("window", [None, 100], ids=["full", "window100"])
def test_split_keys_bf16_matches_reference(window, triton_device):
    if triton_device == "cpu":
        pytest.skip("bf16 dot products need the GPU")
    q, k, v, pos = _case(4, 8, 2, 4, 128, 600, 512, triton_device, torch.bfloat16)
    out = row_attention(q, k, v, pos, window, impl="triton", split_keys=128)
    ref = row_attention_reference(q.float(), k.float(), v.float(), pos, window)
    assert (out.float() - ref).abs().max() < 2e-2  # the bound of the default-split bf16 test above


@pytest.mark.parametrize("bad", [0, -64, 48, 96, 64.0, True], ids=str)
def test_split_keys_must_be_a_positive_multiple_of_the_key_block(bad, triton_device):
    q, k, v, pos = _case(1, 4, 2, 2, 16, 40, 40, triton_device)
    for impl in ("triton", "torch"):
        with pytest.raises(ValueError, match="split_keys must be a positive multiple of the key block 64"):
            row_attention(q, k, v, pos, impl=impl, split_keys=bad)


def test_split_keys_follows_the_key_block_and_excludes_splits(triton_device):
    q, k, v, pos = _case(1, 4, 2, 2, 16, 40, 40, triton_device)
    with pytest.raises(ValueError, match="key block 16, got 24"):
        _row_attention_triton(q, k, v, pos, None, None, block_n=16, split_keys=24)
    with pytest.raises(ValueError, match="not both"):
        _row_attention_triton(q, k, v, pos, None, None, splits=2, split_keys=64)


@pytest.mark.gpu
def test_split_keys_bitwise_at_the_8b_layout(cuda_device):
    """Qwen3-8B attention (32 / 8 heads, hd 128), a 16-query verify block in bf16, splits of 128
    keys: every row gives the same bits alone or among 8 rows, over 512 or 1536 slots (slots from
    512 on hold garbage past every position); it stays accurate; the default splits (8 of 64 keys
    for one row over 512, 4 of 384 for 8 rows over 1536) do change the bits."""
    b, nh, nkv, nq, hd, kv, slots = 8, 32, 8, 16, 128, 512, 1536
    q, k, v, _ = _case(b, nh, nkv, nq, hd, slots, slots, cuda_device, torch.bfloat16)
    start = torch.randint(0, kv - nq + 1, (b,))
    start[0] = kv - nq  # row 0 sees all 512 slots
    pos = (start[:, None] + torch.arange(nq)).to(cuda_device)
    k[:, :, kv:] *= 100
    v[:, :, kv:] = float("nan")

    def attend(rows, n, **kw):
        return row_attention(q[rows], k[rows, :, :n], v[rows, :, :n], pos[rows], impl="triton", **kw)

    alone = torch.cat([attend(slice(r, r + 1), kv, split_keys=128) for r in range(b)])
    for rows in (1, b):
        for n in (kv, slots):
            assert torch.equal(attend(slice(0, rows), n, split_keys=128), alone[:rows]), f"{rows} rows, {n} slots"
    ref = row_attention_reference(q.float(), k[:, :, :kv].float(), v[:, :, :kv].float(), pos)
    assert (alone.float() - ref).abs().max() < 2e-2  # the bound of the default-split bf16 test above
    v[:, :, kv:] = torch.randn_like(v[:, :, kv:])  # finite: a NaN read would pass the control trivially
    assert not torch.equal(attend(slice(0, b), slots)[:1], attend(slice(0, 1), kv))


def _each_query_alone_equals_the_block(q, k, v, pos, tile, **kw):
    """Every query of the block run as a block of one, and the block's first `w` queries for each
    width w, equal the whole block's rows bit for bit (one tile of `tile` queries throughout)."""
    block = row_attention(q, k, v, pos, impl="triton", tile_queries=tile, **kw)
    nq = q.shape[2]
    for i in range(nq):
        one = row_attention(q[:, :, i:i + 1], k, v, pos[:, i:i + 1], impl="triton", tile_queries=tile, **kw)
        assert torch.equal(one[:, 0], block[:, i]), f"query {i} alone"
    for w in range(1, nq):
        part = row_attention(q[:, :, :w], k, v, pos[:, :w], impl="triton", tile_queries=tile, **kw)
        assert torch.equal(part, block[:, :w]), f"width {w}"
    return block


def test_tile_queries_makes_a_query_independent_of_the_block_width(triton_device):
    """With fixed key splits and `tile_queries`, a query's output is the same bits as a block of one,
    inside blocks of every width up to the tile, at any slot; the result is the reference's; the
    tile must hold the block and fit the kernel."""
    q, k, v, pos = _case(2, 8, 2, 4, 16, 100, 100, triton_device)
    block = _each_query_alone_equals_the_block(q, k, v, pos, 8, split_keys=64)
    ref = row_attention_reference(q, k, v, pos)
    assert (block - ref).abs().max() < 1e-5
    with pytest.raises(ValueError, match=f"tile_queries={MAX_TILE_ROWS + 1}: must be 1..{MAX_TILE_ROWS}"):
        row_attention(q, k, v, pos, impl="triton", split_keys=64, tile_queries=MAX_TILE_ROWS + 1)
    with pytest.raises(ValueError, match="tile_queries=0"):
        row_attention(q, k, v, pos, impl="triton", split_keys=64, tile_queries=0)


@pytest.mark.parametrize("window", [None, 7])
def test_query_tiles_run_a_prompt_with_each_querys_decode_bits(window, triton_device):
    """A prompt longer than the tile (and than `MAX_TILE_ROWS`) runs in query tiles: causal
    positions 0..q-1 over their own keys, the reference's result, each query the bits it gets
    alone as a one-token decode at its position, and each row the bits it gets without the
    batch's other rows and over a longer K/V buffer."""
    b, nh, nkv, nq, hd = 2, 6, 2, MAX_TILE_ROWS + 9, 16
    q, k, v, _ = _case(b, nh, nkv, nq, hd, 160, nq, triton_device)
    pos = torch.arange(nq, device=triton_device)[None].expand(b, nq)
    kw = dict(impl="triton", split_keys=64, tile_queries=8, window=window)
    prompt = row_attention(q, k, v, pos, **kw)
    ref = row_attention_reference(q, k, v, pos, window)
    assert (prompt - ref).abs().max() < 1e-5
    for i in (0, 7, 8, 41, nq - 1):  # tile edges and the last, partial tile
        one = row_attention(q[:, :, i:i + 1], k, v, pos[:, i:i + 1], **kw)
        assert torch.equal(one[:, 0], prompt[:, i]), f"query {i}"
    alone = row_attention(q[1:], k[1:], v[1:], pos[1:], **kw)
    assert torch.equal(alone, prompt[1:])
    tail = torch.randn(b, nkv, 50, hd, device=triton_device)  # slots past every position: never visible
    longer = row_attention(q, torch.cat([k, tail], 2), torch.cat([v, tail], 2), pos, **kw)
    assert torch.equal(longer, prompt)


@pytest.mark.gpu
def test_tile_queries_bitwise_at_the_8b_layout(cuda_device):
    """Qwen3-8B attention in bf16, a 16-query verify block, splits of 256 keys, a 16-query tile: each
    query alone (the one-token decode) and every narrower block give the block's bits. Printed (not
    asserted: the hardware may agree anyway): whether a block of one without the fixed tile, which
    runs a smaller tile, gives other bits."""
    b, nh, nkv, nq, hd, kv = 4, 32, 8, 16, 128, 600
    q, k, v, pos = _case(b, nh, nkv, nq, hd, kv, kv, cuda_device, torch.bfloat16)
    block = _each_query_alone_equals_the_block(q, k, v, pos, 16, split_keys=256)
    ones = [row_attention(q[:, :, i:i + 1], k, v, pos[:, i:i + 1], impl="triton", split_keys=256)
            for i in range(nq)]
    differ = sum(not torch.equal(o[:, 0], block[:, i]) for i, o in enumerate(ones))
    print(f"tile_queries control: {differ} of {nq} queries alone without the fixed tile differ from the block")


@pytest.mark.gpu
def test_head_groups_bitwise_at_the_qwen25_small_layout(cuda_device):
    """Qwen2.5-0.5B attention (14 / 2 heads, hd 64) in bf16 at exact mode's 16-query tile, which
    runs in head groups of 4 + 3: each query alone and every narrower block give the block's bits,
    each of 8 rows alone its bits in the batch, and the result stays close to the reference."""
    b, nh, nkv, nq, hd, kv = 8, 14, 2, 16, 64, 600
    q, k, v, pos = _case(b, nh, nkv, nq, hd, kv, kv, cuda_device, torch.bfloat16)
    block = _each_query_alone_equals_the_block(q, k, v, pos, 16, split_keys=256)
    for r in range(b):
        one = row_attention(q[r:r + 1], k[r:r + 1], v[r:r + 1], pos[r:r + 1], impl="triton", split_keys=256,
                            tile_queries=16)
        assert torch.equal(one, block[r:r + 1]), f"row {r}"
    ref = row_attention_reference(q.float(), k.float(), v.float(), pos)
    assert (block.float() - ref).abs().max() < 2e-2


@pytest.mark.gpu
def test_query_tiles_bitwise_at_the_qwen25_small_layout(cuda_device):
    """Qwen2.5-0.5B attention in bf16, a 300-token prompt prefilled in exact mode's 16-query tiles
    (splits of 256 keys, head groups of 4 + 3): sampled queries give the bits of the same token
    decoded alone, each row its bits without the others, and the result stays near the reference."""
    b, nh, nkv, nq, hd = 4, 14, 2, 300, 64
    q, k, v, _ = _case(b, nh, nkv, nq, hd, nq, nq, cuda_device, torch.bfloat16)
    pos = torch.arange(nq, device=cuda_device)[None].expand(b, nq)
    kw = dict(impl="triton", split_keys=256, tile_queries=16)
    prompt = row_attention(q, k, v, pos, **kw)
    for i in (0, 15, 16, 255, 256, nq - 1):
        one = row_attention(q[:, :, i:i + 1], k, v, pos[:, i:i + 1], **kw)
        assert torch.equal(one[:, 0], prompt[:, i]), f"query {i}"
    for r in range(b):
        assert torch.equal(row_attention(q[r:r + 1], k[r:r + 1], v[r:r + 1], pos[r:r + 1], **kw), prompt[r:r + 1])
    ref = row_attention_reference(q.float(), k.float(), v.float(), pos)
    assert (prompt.float() - ref).abs().max() < 2e-2


def test_limits_and_dispatch(triton_device):
    q, k, v, pos = _case(1, 2, 1, MAX_TILE_ROWS + 1, 16, 80, 80, triton_device)  # a prompt, not a block
    with pytest.raises(ValueError, match=f"> {MAX_TILE_ROWS} tile rows"):
        row_attention(q, k, v, pos, impl="triton")
    with pytest.raises(ValueError, match="resolved"):
        row_attention(q, k, v, pos, impl="auto")
    assert torch.equal(row_attention(q, k, v, pos, impl="torch"), row_attention_reference(q, k, v, pos))


@pytest.mark.parametrize("nh, nkv, nq, tile", [
    (14, 2, 16, 16),   # Qwen2.5-0.5B's group of 7 at a 16-token verify: groups of 4 + 3 heads
    (12, 2, 16, 16),   # Qwen2.5-1.5B's group of 6: 4 + 2
    (14, 2, 1, 16),    # the 0.5B's decode in the verify's tile
    (8, 1, 9, 9),      # a group of 8 x 9 queries = 72 tile rows: 7 + 1
])
def test_head_groups_match_the_reference(nh, nkv, nq, tile, triton_device):
    """A K/V head whose query heads x tile pass `MAX_TILE_ROWS` is split into head groups (the last
    one partial), each its own program: the result is the reference's, with the default splits and
    with fixed ones."""
    assert (nh // nkv) * tile > MAX_TILE_ROWS and 0 < head_group(nh, nkv, tile) < nh // nkv
    q, k, v, pos = _case(2, nh, nkv, nq, 16, 140, 130, triton_device)
    ref = row_attention_reference(q, k, v, pos)
    for kw in ({}, {"split_keys": 64, "tile_queries": tile}):
        assert (row_attention(q, k, v, pos, impl="triton", **kw) - ref).abs().max() < 1e-5, kw


def test_head_groups_keep_the_exact_guarantees(triton_device):
    """Qwen2.5-0.5B's layout (14 / 2 heads) at exact mode's 16-query tile, in head groups: queries
    alone (first, middle, last) and narrower blocks give the block's bits, and each row alone gives
    its bits in the batch."""
    q, k, v, pos = _case(2, 14, 2, 16, 16, 100, 100, triton_device)
    kw = dict(impl="triton", split_keys=64, tile_queries=16)
    block = row_attention(q, k, v, pos, **kw)
    for i in (0, 7, 15):
        assert torch.equal(row_attention(q[:, :, i:i + 1], k, v, pos[:, i:i + 1], **kw)[:, 0], block[:, i]), i
    for w in (1, 9):
        assert torch.equal(row_attention(q[:, :, :w], k, v, pos[:, :w], **kw), block[:, :w]), f"width {w}"
    for r in range(2):
        assert torch.equal(row_attention(q[r:r + 1], k[r:r + 1], v[r:r + 1], pos[r:r + 1], **kw), block[r:r + 1]), r
    assert (block - row_attention_reference(q, k, v, pos)).abs().max() < 1e-5


def test_split_count_fills_the_gpu_with_whole_blocks_and_caps_tall_tiles():
    assert split_count(1, 8, 768) == 12   # 12 blocks of 64 keys, 96 programs
    assert split_count(32, 8, 768) == 1   # 256 programs already
    assert split_count(1, 8, 10) == 1
    # a 64-row tile (16 queries x 4 heads) walks at least a quarter of the keys per program
    assert split_count(1, 8, 768, tile_rows=64) == 4 and split_count(1, 8, 768, tile_rows=32) == 8
    assert split_count(1, 8, 100, tile_rows=64) == 2  # still no more splits than key blocks


def test_kernel_fits_matches_the_kernels_own_limits():
    """The engine routes a shape to the kernel only where the kernel takes it (the target's and the
    draft's attention ask `kernel_fits`; the kernel raises on the rest). Without head groups the
    whole group must fit one tile (the normal path); with them one head must (exact mode)."""
    assert kernel_fits(32, 8, 16, 128) and kernel_fits(4, 2, 1, 16)
    assert not kernel_fits(32, 8, 17, 128)   # 4 x 17 = 68 tile rows
    assert not kernel_fits(8, 2, 4, 24)      # head_dim not a power of two
    assert not kernel_fits(8, 2, 4, 8)       # head_dim below 16
    assert not kernel_fits(6, 4, 1, 16)      # heads not a multiple of K/V heads
    assert not kernel_fits(14, 2, 16, 64) and kernel_fits(14, 2, 16, 64, head_groups=True)  # 7 x 16 = 112
    assert kernel_fits(32, 8, 64, 128, head_groups=True) and not kernel_fits(32, 8, 65, 128, head_groups=True)
    assert not kernel_fits(6, 4, 1, 16, head_groups=True)
    assert head_group(32, 8, 16) == 4 and head_group(14, 2, 16) == 4 and head_group(14, 2, 8) == 7
    assert head_group(12, 2, 16) == 4 and head_group(8, 1, 65) == 0
