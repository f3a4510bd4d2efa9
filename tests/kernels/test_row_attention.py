"""Per-row masked GQA attention (`dflash2.kernels.row_attention`): the SDPA reference against an
explicit fp64 softmax, and the split-key Triton kernel against the reference (interpreter on
CPU, compiled on a GPU), over GQA groups, windows, key splits, strided views of the cache."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels.row_attention import MAX_TILE_ROWS, _row_attention_triton, kernel_fits, row_attention, \
    row_attention_reference, split_count


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


def test_triton_broadcast_positions_and_bf16(triton_device):
    if triton_device == "cpu":
        pytest.skip("bf16 dot products need the GPU")
    q, k, v, pos = _case(4, 8, 2, 4, 128, 600, 512, triton_device, torch.bfloat16)
    pos = pos[:1]  # one position row for the whole batch
    out = row_attention(q, k, v, pos, impl="triton")
    ref = row_attention_reference(q.float(), k.float(), v.float(), pos)
    assert (out.float() - ref).abs().max() < 2e-2


def test_limits_and_dispatch(triton_device):
    q, k, v, pos = _case(1, 8, 1, 9, 16, 20, 20, triton_device)  # 8 x 9 = 72 tile rows
    with pytest.raises(ValueError, match=f"> {MAX_TILE_ROWS}"):
        row_attention(q, k, v, pos, impl="triton")
    with pytest.raises(ValueError, match="resolved"):
        row_attention(q, k, v, pos, impl="auto")
    assert torch.equal(row_attention(q, k, v, pos, impl="torch"), row_attention_reference(q, k, v, pos))


def test_split_count_fills_the_gpu_with_whole_blocks():
    assert split_count(1, 8, 768) == 12   # 12 blocks of 64 keys, 96 programs
    assert split_count(32, 8, 768) == 1   # 256 programs already
    assert split_count(1, 8, 10) == 1


def test_kernel_fits_matches_the_kernels_own_limits():
    """The engine routes a shape to the kernel only where the kernel takes it (the target's and the
    draft's attention ask `kernel_fits`; the kernel raises on the rest)."""
    assert kernel_fits(32, 8, 16, 128) and kernel_fits(4, 2, 1, 16)
    assert not kernel_fits(32, 8, 17, 128)   # 4 x 17 = 68 tile rows
    assert not kernel_fits(8, 2, 4, 24)      # head_dim not a power of two
    assert not kernel_fits(8, 2, 4, 8)       # head_dim below 16
    assert not kernel_fits(6, 4, 1, 16)      # heads not a multiple of K/V heads
