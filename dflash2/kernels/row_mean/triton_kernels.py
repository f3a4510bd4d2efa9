# Row mean, y[r] = (1 / K) * sum_k x[r, k], for a contiguous x [R, K] starting 16-byte aligned.
#
# One program per row r (a 1-D grid of R programs). It walks the row in BLOCK_K chunks in order,
# c = 0, 1, ..., ceil(K / BLOCK_K) - 1, adding each chunk, widened to fp32, into one fp32 vector
# acc[BLOCK_K] lane by lane (masked lanes of the last chunk add zeros), so lane j holds
# sum_c x[r, c * BLOCK_K + j] summed in chunk order. One tl.sum reduces the BLOCK_K lanes (a
# reduction tree fixed by BLOCK_K and num_warps, both constexpr at launch), the sum is divided
# by K in fp32 and rounded once to y's dtype.
#
# Row invariance: the kernel never sees R (it sizes the grid only), reads nothing of another row,
# and every constexpr (BLOCK_K, num_warps) is chosen by the launcher from K and the dtype, so
# row r's operations, and its bits, are the same whether it is launched alone or among any
# number of other rows. The compiler specializes a binary on its arguments' alignment, and the
# load vector width it derives from that sets the layout and so the tree of tl.sum; the launcher
# therefore hands over only contiguous, 16-byte-aligned rows (row stride K, not a separate
# stride), leaving K and the dtype as the only inputs of that choice.
# Deterministic: no atomics, one fixed order.
import triton
import triton.language as tl


@triton.jit
def _row_mean_kernel(x_ptr, out_ptr, K, BLOCK_K: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)  # int64: r * K may pass 2^31 for long prefills
    row = x_ptr + r * K
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ok = (k0 + rk) < K
        acc += tl.load(row + k0 + rk, mask=ok, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / K
    tl.store(out_ptr + r, mean.to(out_ptr.dtype.element_ty))
