# Per-row masked GQA attention over a static K/V cache, split over the keys (two launches).
#
# Stage 1, one program per (row b, query tile t, K/V head h, head group c, key split s): the GC query heads of
# group c (heads c * GC .. c * GC + GC - 1 of the G = nh / nkv that share K/V head h; NCH = ceil(G
# / GC) groups, one when the whole group fits the tile) and the Q queries of the block form GC * Q
# tile rows of M (row r = local head g * Q + query i), so every key block is read once per group.
# A row's Q_TOTAL queries run in N_TILES tiles of Q (query t * Q + i; one tile, Q = Q_TOTAL, for a
# decode / verify block); each tile runs the same ops whichever tile it is.
# The keys of split s are walked in BLOCK_N blocks with an online softmax (running max m, sum l,
# fp32 accumulator); key j is visible to tile row r iff j <= pos[b, i] (and j > pos[b, i] - WINDOW
# with a window), and blocks past the largest position of the row are skipped. The split's (m, l,
# acc) go to a workspace. Stage 2, one program per (b, h, c, block of MERGE_R tile rows, block of
# MERGE_D head dims): merge the splits' partials (acc = sum_s e^(m_s - m) acc_s, l likewise) and
# write out[b, i, h * G + c * GC + g, :] = acc / l (g the local head). Each output element runs the
# same ops in the same order whatever MERGE_R and MERGE_D are (the max over splits is exact; l and
# acc add split by split), so the blocks only spread the merge over more programs: its bits do not
# depend on them.
#
# Fixed splits (FIXED_SPLITS; the host gives every split the same slot count from slot 0): the
# merge adds the splits one by one in split order (a loop, no tree reduction), and a split in
# which a tile row sees no key (m_s = -inf, l_s = 0, acc_s = 0: stage 1 ran no block or masked
# every one) leaves that row's m (max with -inf), l and acc exactly as they were: l and acc by a
# select, so the identity does not rest on x + 0 * 0 == x (false for x = -0) or on how the
# compiler contracts it. The splits past a row's last position are all such splits, so neither
# their number (from kv) nor the batch changes a row's bits.
import triton
import triton.language as tl

# Integer arguments that take a new value with each prompt or K/V length. Triton would otherwise compile a
# binary per value class (== 1, divisible by 16) of each, so a prompt of a new length could pay a compile
# mid-run; unspecialized, every length shares one binary per set of constexprs (the loads' tiles and order
# do not depend on these values' divisibility, so neither do the results).
PROMPT_DEPENDENT_SPLIT = ["kv_len", "chunk", "q_total", "n_tiles", "s_pb"]
PROMPT_DEPENDENT_MERGE = ["q_total", "n_tiles"]


@triton.jit(do_not_specialize=PROMPT_DEPENDENT_SPLIT)
def _row_attn_split_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, m_ptr, l_ptr,
    kv_len, chunk, scale, q_total, n_tiles,
    s_qb, s_qh, s_qi, s_kb, s_kh, s_kj, s_vb, s_vh, s_vj, s_pb, s_pi,
    NKV: tl.constexpr, G: tl.constexpr, GC: tl.constexpr, NCH: tl.constexpr, Q: tl.constexpr, HD: tl.constexpr,
    M: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    vb = pid // (NKV * NCH)  # (row, query tile)
    b = vb // n_tiles
    h = (pid // NCH) % NKV
    r = tl.arange(0, M)
    g = (pid % NCH) * GC + r // Q  # the query head within K/V head h's group
    i = (vb % n_tiles) * Q + r % Q  # the query within the row
    row_ok = (r < GC * Q) & (g < G) & (i < q_total)
    d = tl.arange(0, HD)
    pos = tl.load(pos_ptr + b * s_pb + i * s_pi, mask=row_ok, other=-1)  # [M] int64
    qt = tl.load(q_ptr + b * s_qb + (h * G + g)[:, None] * s_qh + i[:, None] * s_qi + d[None, :],
                 mask=row_ok[:, None], other=0.0)  # [M, HD]
    start = s * chunk
    end = tl.minimum(start + chunk, kv_len)
    end = tl.minimum(end, tl.max(pos, axis=0) + 1)  # later keys are visible to no row
    m_i = tl.full([M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([M], dtype=tl.float32)
    acc = tl.zeros([M, HD], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        j = n0 + tl.arange(0, BLOCK_N)
        j_ok = j < end
        kt = tl.load(k_ptr + b * s_kb + h * s_kh + j[:, None] * s_kj + d[None, :], mask=j_ok[:, None], other=0.0)
        if IEEE:  # fp32 inputs: full fp32 products (tf32 would round them)
            sc = tl.dot(qt, tl.trans(kt), input_precision="ieee") * scale  # [M, BLOCK_N]
        else:
            sc = tl.dot(qt, tl.trans(kt)).to(tl.float32) * scale
        vis = j_ok[None, :] & (j[None, :] <= pos[:, None])
        if WINDOW > 0:
            vis = vis & (j[None, :] > pos[:, None] - WINDOW)
        sc = tl.where(vis, sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alive = m_new > float("-inf")  # rows that have seen a visible key so far
        alpha = tl.where(alive, tl.exp(m_i - tl.where(alive, m_new, 0.0)), 1.0)
        p = tl.where(vis, tl.exp(sc - tl.where(alive, m_new, 0.0)[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(v_ptr + b * s_vb + h * s_vh + j[:, None] * s_vj + d[None, :], mask=j_ok[:, None], other=0.0)
        if IEEE:
            pv = tl.dot(p, vt, input_precision="ieee")
        else:
            pv = tl.dot(p.to(vt.dtype), vt).to(tl.float32)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    base = (pid * SPLITS + s) * M
    tl.store(m_ptr + base + r, m_i)
    tl.store(l_ptr + base + r, l_i)
    tl.store(acc_ptr + (base + r)[:, None] * HD + d[None, :], acc)


@triton.jit
def _merge_one_split(acc_ptr, m_ptr, l_ptr, base, r, d, ref, l_all, acc,
                     HD: tl.constexpr, FIXED_SPLITS: tl.constexpr):
    """Split `base`'s partials added to the running (l_all, acc) of tile rows `r`, head dims `d`."""
    m_s = tl.load(m_ptr + base + r)
    live = m_s > float("-inf")
    w = tl.where(live, tl.exp(m_s - ref), 0.0)
    l_s = tl.load(l_ptr + base + r)
    acc_s = tl.load(acc_ptr + (base + r)[:, None] * HD + d[None, :])
    if FIXED_SPLITS:
        l_all = tl.where(live, l_all + w * l_s, l_all)
        acc = tl.where(live[:, None], acc + w[:, None] * acc_s, acc)
    else:
        l_all += w * l_s
        acc += w[:, None] * acc_s
    return l_all, acc


@triton.jit(do_not_specialize=PROMPT_DEPENDENT_MERGE)
def _row_attn_merge_kernel(
    acc_ptr, m_ptr, l_ptr, out_ptr,
    s_ob, s_oi, s_oh, q_total, n_tiles,
    NKV: tl.constexpr, G: tl.constexpr, GC: tl.constexpr, NCH: tl.constexpr, Q: tl.constexpr, HD: tl.constexpr,
    M: tl.constexpr, SPLITS: tl.constexpr, FIXED_SPLITS: tl.constexpr, MERGE_R: tl.constexpr,
    MERGE_D: tl.constexpr, UNROLL: tl.constexpr,
):
    pid = tl.program_id(0)
    vb = pid // (NKV * NCH)
    b = vb // n_tiles
    h = (pid // NCH) % NKV
    r = tl.program_id(1) * MERGE_R + tl.arange(0, MERGE_R)
    d = tl.program_id(2) * MERGE_D + tl.arange(0, MERGE_D)
    m_all = tl.full([MERGE_R], float("-inf"), dtype=tl.float32)
    for s in range(SPLITS):
        m_all = tl.maximum(m_all, tl.load(m_ptr + (pid * SPLITS + s) * M + r))
    alive = m_all > float("-inf")
    ref = tl.where(alive, m_all, 0.0)
    l_all = tl.zeros([MERGE_R], dtype=tl.float32)
    acc = tl.zeros([MERGE_R, MERGE_D], dtype=tl.float32)
    # Either way the splits add one by one in split order; UNROLL (a compile-time loop) only lets
    # the compiler issue the splits' loads ahead of the adds.
    if UNROLL:
        for s in tl.static_range(SPLITS):
            l_all, acc = _merge_one_split(acc_ptr, m_ptr, l_ptr, (pid * SPLITS + s) * M, r, d, ref, l_all, acc,
                                          HD, FIXED_SPLITS)
    else:
        for s in range(SPLITS):
            l_all, acc = _merge_one_split(acc_ptr, m_ptr, l_ptr, (pid * SPLITS + s) * M, r, d, ref, l_all, acc,
                                          HD, FIXED_SPLITS)
    out = acc / tl.where(l_all > 0, l_all, 1.0)[:, None]  # a row with no visible key gives 0
    g = (pid % NCH) * GC + r // Q
    i = (vb % n_tiles) * Q + r % Q
    row_ok = (r < GC * Q) & (g < G) & (i < q_total)
    tl.store(out_ptr + b * s_ob + i[:, None] * s_oi + (h * G + g)[:, None] * s_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
