# Small-M linear, y[m, n] = sum_k x[m, k] * W[n, k] + b[n], streaming the weights once.
#
# W is [N, K] with K contiguous (the nn.Linear layout), x is [M, K]: BLOCK_M rows per row tile r,
# ceil(M / BLOCK_M) row tiles. The row tile is the fastest-varying program index, so the programs
# of one weight tile run next to each other and share its reads through L2.
# Stage 1, one program per (row tile r, output-column tile t, K split s): it owns the BLOCK_N columns
# n = t * BLOCK_N + [0, BLOCK_N) and the K range [s * k_chunk, min((s + 1) * k_chunk, K)),
# walks that range in BLOCK_K chunks (wide loads of the W tile [BLOCK_N, BLOCK_K], pipelined
# num_stages deep), and keeps the partial sums of all BLOCK_M rows in registers as the
# transposed tile acc[n, m] = sum_k W[n, k] x[m, k] (W is the MMA's A operand, so the tile's
# long side BLOCK_N is the MMA's M side and the few rows of x its N side: "swap AB").
# With one split the program adds the bias and writes y. With several it writes its fp32
# partial to part[s, m, n] and takes a ticket (an atomic counter per (row tile, column tile), zero between
# calls); the program that draws the last ticket reads all partials back, sums them in the fixed
# order s = 0, 1, ..., adds the bias, rounds once, writes y and sets the counter back to zero.
# Which program finishes last varies from run to run; the order of the sum does not, so the
# result is deterministic, and no second launch is needed.
#
# Row invariance: nothing in the kernel depends on M or on another row's values. BLOCK_M is
# fixed by the launcher (not chosen from M), M is not specialized (one binary for all M),
# masked rows are zeros, every row tile runs the same code, each output element is one fixed
# sequence of MMAs over K and one fixed-order sum over splits, so row i's result is the same
# bits whether it is computed alone or with any number of other rows.
#
# WIDEN is set for CPU tensors (the Triton interpreter, in tests) only: the interpreter's dot
# multiplies bf16 / fp16 tiles as their raw 16-bit integers, so they are widened to fp32 first.
# A product of two 16-bit floats is exact in fp32, so this is the tensor cores' arithmetic
# (exact products, fp32 sums) up to the order of the sums inside one MMA.
#
# PDL (programmatic dependent launch, Hopper and later; LinearConfig.pdl):
# launched with launch_pdl, the kernel may be started while the previous kernel on the stream
# finishes. It first waits for that kernel to complete (gdc_wait: its writes are then visible;
# nothing is read or written before), and once its weights are read it lets the next kernel
# start launching (gdc_launch_dependents), to overlap the launch gap with its epilogue.
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit(do_not_specialize=["M"])  # one binary for every row count (M = 1 would be specialized)
def _small_m_linear_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, ticket_ptr,
    M, N, K, k_chunk,
    s_xm, s_wn, s_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, WIDEN: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
    r = tl.program_id(0)
    t = tl.program_id(1)
    s = tl.program_id(2)
    rn = t * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output columns = rows of W
    rm = r * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x in this row tile
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    out_ok = n_ok[:, None] & m_ok[None, :]
    k_start = s * k_chunk
    k_end = tl.minimum(k_start + k_chunk, K)
    w_ptrs = w_ptr + rn[:, None] * s_wn + (k_start + rk)[None, :]  # [BLOCK_N, BLOCK_K]
    x_ptrs = x_ptr + rm[None, :] * s_xm + (k_start + rk)[:, None]  # [BLOCK_K, BLOCK_M] = x^T
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:  # K and k_chunk are multiples of BLOCK_K: no K mask, full-width loads
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
            xt = tl.load(x_ptrs, mask=m_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + rk) < k_end
            w = tl.load(w_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            xt = tl.load(x_ptrs, mask=m_ok[None, :] & k_ok[:, None], other=0.0)
        if WIDEN:  # interpreter only: its dot multiplies 16-bit floats as raw integers
            w = w.to(tl.float32)
            xt = xt.to(tl.float32)
        if IEEE or WIDEN:  # fp32 (or widened) tiles: full fp32 products (tf32 would round them)
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xt, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if PDL:  # the weights are read: the next kernel may start launching during the epilogue
        gdc_launch_dependents()
    o_ptrs = out_ptr + rm[None, :] * s_om + rn[:, None]
    if SPLITS == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_ok)
    else:
        p_ptrs = part_ptr + rm[None, :] * N + rn[:, None]  # part[s, m, n], fp32, split stride M * N
        tl.store(p_ptrs + s * M * N, acc, mask=out_ok)
        tl.debug_barrier()  # every thread's partial is written before the release below
        ticket = ticket_ptr + r * tl.num_programs(1) + t  # one counter per (row tile, column tile)
        arrived = tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:  # the last split of this tile to finish sums them all, in order
            tl.debug_barrier()
            total = tl.load(p_ptrs, mask=out_ok, other=0.0, cache_modifier=".cg")
            for i in tl.static_range(1, SPLITS):
                total += tl.load(p_ptrs + i * M * N, mask=out_ok, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[:, None]
            tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_ok)
            tl.store(ticket, 0)  # reset for the next call (ordered by the kernel boundary)
