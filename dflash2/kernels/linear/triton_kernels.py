# Small-M linear, y[m, n] = sum_k x[m, k] * W[n, k] + b[n], streaming the weights once.
#
# W is [N, K] with K contiguous (the nn.Linear layout), x is [M, K]: BLOCK_M rows per row tile,
# ceil(M / BLOCK_M) row tiles, ROW_TILES consecutive row tiles per row group r (1 to 4). The row
# group is the fastest-varying program index, so the programs of one weight tile run next to each
# other and share its reads through L2.
# One program per (row group r, output-column tile t, K split s): it owns the BLOCK_N columns
# n = t * BLOCK_N + [0, BLOCK_N) and the K range [s * k_chunk, min((s + 1) * k_chunk, K)),
# walks that range in BLOCK_K chunks (wide loads of the W tile [BLOCK_N, BLOCK_K], pipelined
# num_stages deep), and keeps the partial sums of each row tile in registers as the transposed
# tile acc[n, m] = sum_k W[n, k] x[m, k] (W is the MMA's A operand, so the tile's long side
# BLOCK_N is the MMA's M side and the few rows of x its N side: "swap AB"). Each W tile it loads
# feeds one MMA per row tile of its group, so a group of ROW_TILES row tiles reads the weights
# once where ROW_TILES one-tile programs would read them ROW_TILES times.
# With one split the program adds the bias and writes y. With several it writes its fp32
# partial to part[s, m, n] and takes a ticket (an atomic counter per (row tile, column tile), zero between
# calls); the program that draws the last ticket reads all partials back, sums them in the fixed
# order s = 0, 1, ..., adds the bias, rounds once, writes y and sets the counter back to zero.
# Which program finishes last varies from run to run; the order of the sum does not, so the
# result is deterministic, and no second launch is needed.
#
# Fused linears (NUM_W = 2 or 3): W is the row-wise concatenation of up to three matrices that
# stay where they are (w_ptr, w2_ptr, w3_ptr; rows [0, N1), [N1, N2), [N2, N) of W), all with
# row stride s_wn. Each W row is read from the matrix that holds it (a per-row select of the
# tile's pointers, constant along K), so a fused launch reads the members' own weights and every
# column gets the arithmetic it would get from the one concatenated matrix.
#
# Row invariance: nothing in a row's arithmetic depends on M or on another row's values. BLOCK_M
# is fixed by the launcher (not chosen from M), M is not specialized (one binary per group size),
# masked rows are zeros, every row tile runs the same code whatever group it is in (the same
# [BLOCK_N, BLOCK_K] x [BLOCK_K, BLOCK_M] MMA on the same W tile at every K step), each output
# element is one fixed sequence of MMAs over K and one fixed-order sum over splits, so row i's
# result is the same bits whether it is computed alone or with any number of other rows.
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


@triton.jit
def _x_tile(x_ptr, rm, rk, k0, k_end, M, s_xm, EVEN_K: tl.constexpr, WIDEN: tl.constexpr):
    """The x^T tile [BLOCK_K, BLOCK_M] of rows `rm` at inputs k0 + rk (masked rows and inputs: 0)."""
    ptrs = x_ptr + rm[None, :] * s_xm + (k0 + rk)[:, None]
    if EVEN_K:  # K and k_chunk are multiples of BLOCK_K: no K mask, full-width loads
        xt = tl.load(ptrs, mask=(rm < M)[None, :], other=0.0)
    else:
        xt = tl.load(ptrs, mask=(rm < M)[None, :] & ((k0 + rk) < k_end)[:, None], other=0.0)
    if WIDEN:  # interpreter only: its dot multiplies 16-bit floats as raw integers
        xt = xt.to(tl.float32)
    return xt


@triton.jit
def _mma(w, xt, acc, IEEE: tl.constexpr):
    if IEEE:  # fp32 (or widened) tiles: full fp32 products (tf32 would round them)
        out = tl.dot(w, xt, acc, input_precision="ieee")
    else:
        out = tl.dot(w, xt, acc)
    return out


@triton.jit
def _finish(acc, rm, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
            STAGE: tl.constexpr):
    """One row tile's epilogue. One split (STAGE 0): bias, round, write y. Several: STAGE 1 writes
    this split's fp32 partial to part[s, m, n]; STAGE 2 (the last split to arrive) sums the
    partials in the order s = 0, 1, ..., adds the bias, rounds once and writes y."""
    ok = (rn < N)[:, None] & (rm < M)[None, :]
    o_ptrs = out_ptr + rm[None, :] * s_om + rn[:, None]
    p_ptrs = part_ptr + rm[None, :] * N + rn[:, None]  # part[s, m, n], fp32, split stride M * N
    if STAGE == 1:
        tl.store(p_ptrs + s * M * N, acc, mask=ok)
    else:
        total = acc
        if STAGE == 2:
            total = tl.load(p_ptrs, mask=ok, other=0.0, cache_modifier=".cg")
            for i in tl.static_range(1, SPLITS):
                total += tl.load(p_ptrs + i * M * N, mask=ok, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            total += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
        tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _finish_group(acc0, acc1, acc2, acc3, rm0, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, BLOCK_M: tl.constexpr,
                  ROW_TILES: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, STAGE: tl.constexpr):
    """`_finish` at `STAGE` for each of the group's ROW_TILES row tiles (accumulators acc0.., rows
    from rm0 on, BLOCK_M per tile)."""
    _finish(acc0, rm0, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, SPLITS, HAS_BIAS, STAGE)
    if ROW_TILES > 1:
        _finish(acc1, rm0 + BLOCK_M, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, SPLITS, HAS_BIAS, STAGE)
    if ROW_TILES > 2:
        _finish(acc2, rm0 + 2 * BLOCK_M, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, SPLITS, HAS_BIAS, STAGE)
    if ROW_TILES > 3:
        _finish(acc3, rm0 + 3 * BLOCK_M, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, SPLITS, HAS_BIAS, STAGE)


@triton.jit(do_not_specialize=["M"])  # one binary per ROW_TILES for every row count (M = 1 would be specialized)
def _small_m_linear_kernel(
    x_ptr, w_ptr, w2_ptr, w3_ptr, b_ptr, out_ptr, part_ptr, ticket_ptr,
    M, N, K, k_chunk, N1, N2,
    s_xm, s_wn, s_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLITS: tl.constexpr,
    ROW_TILES: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    WIDEN: tl.constexpr, PDL: tl.constexpr, NUM_W: tl.constexpr,
):
    if PDL:
        gdc_wait()
    r = tl.program_id(0)
    t = tl.program_id(1)
    s = tl.program_id(2)
    rn = t * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output columns = rows of W
    rm0 = r * (ROW_TILES * BLOCK_M) + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x in the group's first tile
    rm1 = rm0 + BLOCK_M
    rm2 = rm0 + 2 * BLOCK_M
    rm3 = rm0 + 3 * BLOCK_M
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    k_start = s * k_chunk
    k_end = tl.minimum(k_start + k_chunk, K)
    k_cols = (k_start + rk)[None, :]
    w_ptrs = w_ptr + rn[:, None] * s_wn + k_cols  # [BLOCK_N, BLOCK_K]
    if NUM_W > 1:  # rows past N1 (and N2) live in the second (third) matrix, at row rn - N1 (- N2)
        w_ptrs = tl.where(rn[:, None] >= N1, w2_ptr + (rn - N1)[:, None] * s_wn + k_cols, w_ptrs)
    if NUM_W > 2:
        w_ptrs = tl.where(rn[:, None] >= N2, w3_ptr + (rn - N2)[:, None] * s_wn + k_cols, w_ptrs)
    acc0 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # row tiles past ROW_TILES stay unused
    acc2 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs, mask=n_ok[:, None] & ((k0 + rk) < k_end)[None, :], other=0.0)
        if WIDEN:
            w = w.to(tl.float32)
        acc0 = _mma(w, _x_tile(x_ptr, rm0, rk, k0, k_end, M, s_xm, EVEN_K, WIDEN), acc0, IEEE)
        if ROW_TILES > 1:
            acc1 = _mma(w, _x_tile(x_ptr, rm1, rk, k0, k_end, M, s_xm, EVEN_K, WIDEN), acc1, IEEE)
        if ROW_TILES > 2:
            acc2 = _mma(w, _x_tile(x_ptr, rm2, rk, k0, k_end, M, s_xm, EVEN_K, WIDEN), acc2, IEEE)
        if ROW_TILES > 3:
            acc3 = _mma(w, _x_tile(x_ptr, rm3, rk, k0, k_end, M, s_xm, EVEN_K, WIDEN), acc3, IEEE)
        w_ptrs += BLOCK_K
    if PDL:  # the weights are read: the next kernel may start launching during the epilogue
        gdc_launch_dependents()
    if SPLITS == 1:
        _finish_group(acc0, acc1, acc2, acc3, rm0, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, BLOCK_M, ROW_TILES,
                      SPLITS, HAS_BIAS, 0)
    else:
        # Partials, then a ticket (an atomic counter per (row group, column tile), zero between
        # calls); the program that draws the last ticket sums every split of its group's tiles.
        _finish_group(acc0, acc1, acc2, acc3, rm0, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, BLOCK_M, ROW_TILES,
                      SPLITS, HAS_BIAS, 1)
        tl.debug_barrier()  # every thread's partial is written before the release below
        ticket = ticket_ptr + r * tl.num_programs(1) + t
        arrived = tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:  # the last split of this group to finish sums them all, in order
            tl.debug_barrier()
            _finish_group(acc0, acc1, acc2, acc3, rm0, rn, b_ptr, out_ptr, part_ptr, s, M, N, s_om, BLOCK_M,
                          ROW_TILES, SPLITS, HAS_BIAS, 2)
            tl.store(ticket, 0)  # reset for the next call (ordered by the kernel boundary)
