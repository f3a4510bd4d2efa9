# Block verification (spec 8), two launches.
#
# Stage 1, one program per (request b, logits row i, vocab chunk):
#   max_c, first argmax_c, sumexp_c = sum_v exp(l_v - max_c), NaN count;
#   for T > 0 rows also the race partial over the non-candidate ids of the chunk:
#   R_c = max_v (l_v - log E_v), E_v = -log U(seed, TARGET, pos + i, v)       (and its lowest id)
#   (the k candidates of slot i are left out here; their residual keys need lse, see stage 2).
# Stage 2, one program per request: merge the chunk partials into per-row
#   lse_i = M_i + log sum_c sumexp_c e^(max_c - M_i),  argmax_i,  R_i,
# then the acceptance walk (T = 0: d_i == argmax_i; T > 0: u_i q_i(d_i) < p_i(d_i),
# u_i = U(seed, ACCEPT, pos + i, 0)), accepted = first rejected slot s (or N), and the next token:
#   T = 0: argmax_s;
#   T > 0: argmax over v of log r_v - log E_v, r = (p_s - q_s)+ (q only at the k candidates:
#          log r_v = l_v - lse_s elsewhere, so R_s - lse_s is the non-candidate best), falling
#          back to p_s when r is empty; at s = N the bonus race over p_N.
# Rows with NaN / all -inf / +inf logits flag the request: accepted = 0, next = -1.
# On CUDA the outer log of stage 1's log E uses the hardware lg2 (FAST_LOG): ~1e-7 absolute error
# on the race keys, which can only matter for keys within ~1e-6 of each other.
import triton
import triton.language as tl
from triton.language.extra import libdevice

from dflash2.kernels.keyed_random import key_prefix_tl, uniform_from_prefix_tl

_BIG = tl.constexpr(2147483647)


@triton.jit
def _verify_stats_kernel(
    logits_ptr, cand_ptr, temp_ptr, seed_ptr, pos_ptr,
    mx_ptr, am_ptr, se_ptr, rk_ptr, ri_ptr, nan_ptr,
    V, N, k, n_chunks,
    s_lb, s_li, s_cb, s_cj,
    TARGET: tl.constexpr, BLOCK: tl.constexpr, KP: tl.constexpr, FAST_LOG: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // (N + 1)
    i = row % (N + 1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    x = tl.load(logits_ptr + b.to(tl.int64) * s_lb + i.to(tl.int64) * s_li + offs, mask=ok, other=float("-inf"))
    x = x.to(tl.float32)
    is_nan = x != x
    n_nan = tl.sum(is_nan.to(tl.int32), axis=0)
    x = tl.where(is_nan, float("-inf"), x)  # NaN rows are flagged; keep the reductions defined
    mx, mx_at = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    temp = tl.load(temp_ptr + b).to(tl.float32)
    out = row.to(tl.int64) * n_chunks + chunk
    if temp > 0.0:
        m_safe = tl.where(mx == float("-inf"), 0.0, mx)
        se = tl.sum(tl.exp(x - m_safe), axis=0)
        seed = tl.load(seed_ptr + b).to(tl.int64)
        pos = tl.load(pos_ptr + b).to(tl.int64) + i
        u = uniform_from_prefix_tl(key_prefix_tl(seed, TARGET, pos), offs)
        e = -tl.log(u)  # accurate: for u near 1, E ~ 6e-8 and an approximate log could give <= 0
        if FAST_LOG:  # hardware lg2 (~1e-7 absolute error on log E); libdevice's logf is ~20 instructions
            key = x - libdevice.fast_logf(e)  # -inf stays -inf
        else:
            key = x - tl.log(e)
        kk = tl.arange(0, KP)
        cand = tl.load(cand_ptr + b.to(tl.int64) * s_cb + i.to(tl.int64) * s_cj + kk,
                       mask=(kk < k) & ((kk * 0 + i) < N), other=-1)
        best, best_at = tl.max(key, axis=0, return_indices=True, return_indices_tie_break_left=True)
        best_i = chunk * BLOCK + best_at
        # Drop candidates that win, one at a time (each candidate at most once).
        while (best > float("-inf")) & (tl.sum((cand == best_i).to(tl.int32), axis=0) > 0):
            key = tl.where(offs == best_i, float("-inf"), key)
            best, best_at = tl.max(key, axis=0, return_indices=True, return_indices_tie_break_left=True)
            best_i = chunk * BLOCK + best_at
        tl.store(se_ptr + out, se)
        tl.store(rk_ptr + out, best)
        tl.store(ri_ptr + out, best_i)
    else:
        tl.store(am_ptr + out, chunk * BLOCK + mx_at)  # first maximum
    tl.store(mx_ptr + out, mx)
    tl.store(nan_ptr + out, n_nan)


@triton.jit
def _pick_first(key, ids, other_key, other_id):
    # Winner of (max key, lowest id) between a vector's best and one (key, id) pair.
    best = tl.max(key, axis=0)
    best_id = tl.min(tl.where(key == best, ids, _BIG), axis=0)
    win = tl.where(other_key > best, other_id, tl.where(best > other_key, best_id, tl.minimum(best_id, other_id)))
    return tl.maximum(best, other_key), win


@triton.jit
def _verify_combine_kernel(
    logits_ptr, draft_ptr, cand_ptr, q_ptr, temp_ptr, seed_ptr, pos_ptr,
    mx_ptr, am_ptr, se_ptr, rk_ptr, ri_ptr, nan_ptr,
    acc_ptr, next_ptr,
    V, N, k, n_chunks,
    s_lb, s_li, s_db, s_cb, s_cj, s_qb, s_qj,
    ACCEPT: tl.constexpr, TARGET: tl.constexpr, NP1P: tl.constexpr, NCHP: tl.constexpr, KP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    ii = tl.arange(0, NP1P)  # logits rows
    cc = tl.arange(0, NCHP)  # chunks
    kk = tl.arange(0, KP)
    row_ok = ii < N + 1
    tile = row_ok[:, None] & (cc < n_chunks)[None, :]
    part = (b * (N + 1) + ii)[:, None] * n_chunks + cc[None, :]
    temp = tl.load(temp_ptr + b).to(tl.float32)
    sampled = temp > 0.0
    seed = tl.load(seed_ptr + b).to(tl.int64)
    pos = tl.load(pos_ptr + b).to(tl.int64)

    mx = tl.load(mx_ptr + part, mask=tile, other=float("-inf"))
    n_nan = tl.sum(tl.load(nan_ptr + part, mask=tile, other=0), axis=1)
    row_max = tl.max(mx, axis=1)  # [NP1P]
    bad_row = row_ok & ((n_nan > 0) | (row_max == float("inf")) | (row_max == float("-inf")))
    bad = tl.max(bad_row.to(tl.int32), axis=0) > 0
    # Chunks cover increasing ids, so the first chunk reaching the row max holds its first argmax.
    first_c = tl.min(tl.where(tile & (mx == row_max[:, None]), cc[None, :], _BIG), axis=1)
    # (Partials a row's temperature did not produce are never read: masks are vectors, since the
    # interpreter cannot AND a scalar into a tensor mask.)
    samp_t = (tl.zeros((NP1P, NCHP), tl.float32) + temp) > 0.0
    am = tl.load(am_ptr + part, mask=tile & (cc[None, :] == first_c[:, None]) & (samp_t == 0), other=0)
    row_argmax = tl.sum(tl.where(cc[None, :] == first_c[:, None], am, 0), axis=1)
    m_safe = tl.where(row_max == float("-inf"), 0.0, row_max)
    se = tl.load(se_ptr + part, mask=tile & samp_t, other=0.0)
    se_tot = tl.sum(tl.where(tile, se * tl.exp(mx - m_safe[:, None]), 0.0), axis=1)
    lse = m_safe + tl.log(se_tot)  # [NP1P]
    rk = tl.load(rk_ptr + part, mask=tile & samp_t, other=float("-inf"))
    row_rk = tl.max(rk, axis=1)
    first_r = tl.min(tl.where(tile & (rk == row_rk[:, None]), cc[None, :], _BIG), axis=1)
    ri = tl.load(ri_ptr + part, mask=tile & (cc[None, :] == first_r[:, None]) & samp_t, other=0)
    row_ri = tl.sum(tl.where(cc[None, :] == first_r[:, None], ri, 0), axis=1)

    # Acceptance of the N draft slots. Everything the next-token step may need (candidates, q
    # and their logits for every slot) is loaded here too, so no load waits on the walk.
    slot_ok = ii < N
    d = tl.load(draft_ptr + b * s_db + ii, mask=slot_ok, other=0).to(tl.int64)
    row_ptr = logits_ptr + b * s_lb + ii.to(tl.int64) * s_li  # [NP1P]
    l_d = tl.load(row_ptr + d, mask=slot_ok, other=float("-inf")).to(tl.float32)
    samp_k = (tl.zeros((NP1P, KP), tl.float32) + temp) > 0.0
    ck_ok = slot_ok[:, None] & (kk < k)[None, :] & samp_k
    cand_t = tl.load(cand_ptr + b * s_cb + ii[:, None] * s_cj + kk[None, :], mask=ck_ok, other=-1).to(tl.int64)
    q_t = tl.load(q_ptr + b * s_qb + ii[:, None] * s_qj + kk[None, :], mask=ck_ok, other=0.0)
    l_t = tl.load(row_ptr[:, None] + cand_t, mask=ck_ok, other=float("-inf")).to(tl.float32)
    p_d = tl.exp(l_d - lse)
    q_d = tl.sum(tl.where(cand_t == d[:, None], q_t, 0.0), axis=1)
    u = uniform_from_prefix_tl(key_prefix_tl(seed, ACCEPT, pos + ii), ii * 0)
    ok = tl.where(sampled, u * q_d < p_d, d == row_argmax)
    accepted = tl.min(tl.where(slot_ok & (ok == 0), ii, N), axis=0)
    s = accepted

    # Next token from row s.
    sel = ii == s
    greedy_next = tl.sum(tl.where(sel, row_argmax, 0), axis=0).to(tl.int64)
    lse_s = tl.sum(tl.where(sel, lse, 0.0), axis=0)
    nonc = tl.sum(tl.where(sel, row_rk, 0.0), axis=0) - lse_s  # best non-candidate log r - log E
    nonc_id = tl.sum(tl.where(sel, row_ri, 0), axis=0)
    sel_t = sel[:, None] & ck_ok  # [NP1P, KP]; empty when s == N (bonus: no candidates)
    c_ok = tl.max(sel_t.to(tl.int32), axis=0) > 0  # [KP]
    cand_s = tl.sum(tl.where(sel_t, cand_t, 0), axis=0)
    q_s = tl.sum(tl.where(sel_t, q_t, 0.0), axis=0)
    l_c = tl.max(tl.where(sel_t, l_t, float("-inf")), axis=0)
    u_c = uniform_from_prefix_tl(key_prefix_tl(seed, TARGET, pos + s), cand_s)
    log_e = tl.log(-tl.log(u_c))
    r_c = tl.exp(l_c - lse_s) - q_s
    res_c = tl.where(c_ok & (r_c > 0.0), tl.log(r_c) - log_e, float("-inf"))
    p_c = tl.where(c_ok, (l_c - log_e) - lse_s, float("-inf"))
    cand_i32 = cand_s.to(tl.int32)
    res_best, res_tok = _pick_first(res_c, cand_i32, nonc, nonc_id)
    _, p_tok = _pick_first(p_c, cand_i32, nonc, nonc_id)
    race_next = tl.where(res_best > float("-inf"), res_tok, p_tok).to(tl.int64)
    next_tok = tl.where(sampled, race_next, greedy_next)
    tl.store(acc_ptr + b, tl.where(bad, 0, accepted).to(tl.int64))
    tl.store(next_ptr + b, tl.where(bad, -1, next_tok))
