# Selector edges + walk (spec 5.3-5.4), two launches.
#
# Edges, one program per (slot j, request b), independent of the walk:
#   S[b, j, p, c] = U[b, j, c] + sum_r A[pred(j, p), r] * eta[b, j, r] * Z[C[b, j, c], r]     (fp32)
#   pred(0, p) = anchor[b],  pred(j, p) = C[b, j - 1, p]
# Walk, one program (one warp) per request, all edges in registers; p_0 = 0 and for j = 0..N-1:
#   row = S[b, j, p_j, :]
#   T = 0:  c* = argmax_c row[c]                          (ties -> lowest c), q_j = onehot(c*)
#   T > 0:  c* = argmax_c row[c] / T + G_c,  G_c = -log(-log u(seed, DRAFT, pos + j, C[b, j, c]))
#           q_j = softmax(row / T)
#   d_j = C[b, j, c*],  p_{j+1} = c*
# Splitting the two keeps every global load off the walk's serial chain. A greedy row (T = 0) takes
# the branch without the keyed uniforms and the softmax (the same picks: the first maximum of the
# row); the tokens are gathered from the picks after the walk.
import triton
import triton.language as tl

from dflash2.kernels.keyed_random import key_prefix_tl, uniform_from_prefix_tl


@triton.jit
def _selector_edges_kernel(
    unary_ptr, cand_ptr, eta_ptr, a_ptr, z_ptr, anchor_ptr, s_ptr,
    N, k, R,
    s_ub, s_uj, s_cb, s_cj, s_eb, s_ej, s_av, s_zv,
    KP: tl.constexpr, RB: tl.constexpr,
):
    j = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    kk = tl.arange(0, KP)
    rr = tl.arange(0, RB)
    kok = kk < k
    tile_ok = kok[:, None] & (rr < R)[None, :]
    first = (kk * 0 + j) == 0  # [KP] (vector form: the interpreter wants tensor conditions)
    cand = tl.load(cand_ptr + b * s_cb + j * s_cj + kk, mask=kok, other=0).to(tl.int64)
    prev = tl.load(cand_ptr + b * s_cb + (j - 1) * s_cj + kk, mask=kok & (first == 0), other=0).to(tl.int64)
    anchor = tl.load(anchor_ptr + b).to(tl.int64)
    pred = tl.where(first, anchor, prev)  # [KP]
    eta = tl.load(eta_ptr + b * s_eb + j * s_ej + rr, mask=rr < R, other=0.0).to(tl.float32)
    a_t = tl.load(a_ptr + pred[:, None] * s_av + rr[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    z_t = tl.load(z_ptr + cand[:, None] * s_zv + rr[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    edges = tl.dot(a_t * eta[None, :], tl.trans(z_t), input_precision="ieee")  # [KP pred, KP cand]
    un = tl.load(unary_ptr + b * s_ub + j * s_uj + kk, mask=kok, other=0.0).to(tl.float32)
    out = s_ptr + ((b * N + j) * KP + kk[:, None]) * KP + kk[None, :]
    tl.store(out, edges + un[None, :])


@triton.jit
def _selector_walk_kernel(
    s_ptr, cand_ptr, temp_ptr, seed_ptr, pos_ptr,
    tok_ptr, chosen_ptr, q_ptr,
    N, k,
    s_cb, s_cj, s_tb, s_hb, s_qb, s_qj,
    STREAM: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kk = tl.arange(0, KP)
    jj = tl.arange(0, NP)
    rows = tl.arange(0, NP * KP)  # (slot, predecessor) pairs
    kok = kk < k
    edges = tl.load(s_ptr + (b * N * KP + rows)[:, None] * KP + kk[None, :], mask=(rows < N * KP)[:, None], other=0.0)
    cands = tl.load(cand_ptr + b * s_cb + jj[:, None] * s_cj + kk[None, :], mask=(jj < N)[:, None] & kok[None, :],
                    other=0)
    temp = tl.load(temp_ptr + b).to(tl.float32)
    seed = tl.load(seed_ptr + b).to(tl.int64)
    pos = tl.load(pos_ptr + b).to(tl.int64)
    sampled = temp > 0.0
    t_safe = tl.where(sampled, temp, 1.0)
    pick = 0
    picks = jj * 0  # [NP] the pick of each slot, gathered into tokens after the loop
    for j in range(N):
        row = tl.sum(tl.where((rows == j * KP + pick)[:, None], edges, 0.0), axis=0)  # [KP]
        row = tl.where(kok, row, float("-inf"))
        if sampled:
            cand = tl.sum(tl.where((jj == j)[:, None], cands, 0), axis=0).to(tl.int64)  # [KP]
            scaled = row / t_safe
            u = uniform_from_prefix_tl(key_prefix_tl(seed, STREAM, pos + j), cand)
            score = tl.where(kok, scaled - tl.log(-tl.log(u)), float("-inf"))
            best = tl.max(score, axis=0)
            pick = tl.min(tl.where((score == best) & kok, kk, KP), axis=0)  # first maximum
            mx = tl.max(scaled, axis=0)
            e = tl.where(kok, tl.exp(scaled - mx), 0.0)
            q = e / tl.sum(e, axis=0)
        else:  # greedy: the first maximum of the row, q one-hot (no keyed uniforms, no softmax)
            best = tl.max(row, axis=0)
            pick = tl.min(tl.where((row == best) & kok, kk, KP), axis=0)
            q = tl.where(kk == pick, 1.0, 0.0)
        tl.store(q_ptr + b * s_qb + j * s_qj + kk, q, mask=kok)
        picks = tl.where(jj == j, pick, picks)
    slot_ok = jj < N
    tl.store(tok_ptr + b * s_tb + jj, tl.sum(tl.where(kk[None, :] == picks[:, None], cands, 0), axis=1), mask=slot_ok)
    tl.store(chosen_ptr + b * s_hb + jj, picks.to(tl.int64), mask=slot_ok)
