# Head CE: the CE statistics, the logit gradient and the group maxima of one row per program.
#
# Program r reads row r of z [N, V] twice (V % GROUP == 0, n_groups = V / GROUP):
#   pass 1, in tiles of TILE_GROUPS groups ([TILE_GROUPS, GROUP] values widened to fp32): each
#           group's maximum is stored to gmax[r] (exact, in z's dtype); the row's running maximum
#           m and scaled sum s (online logsumexp: s <- s * exp(m - m') + sum exp(x - m')) give
#           lse = m + log(s), stored to lse[r] (fp32);
#   pass 2, in BLOCK columns: grad[r, v] = coef[r] * (exp(z[r, v] - lse) - [v == y[r]]), fp32,
#           rounded once (round_to, ties to even) to grad's dtype.
# Deterministic: no atomics, one fixed order per row, nothing read from another row.
# A row whose first tile is all -inf gives NaN (as the exp of -inf - -inf); logits never are.
import triton
import triton.language as tl

from dflash2.kernels.rounding import round_to


@triton.jit
def _head_ce_kernel(z_ptr, y_ptr, coef_ptr, lse_ptr, grad_ptr, gmax_ptr, V, n_groups,
                    GROUP: tl.constexpr, TILE_GROUPS: tl.constexpr, BLOCK: tl.constexpr, KIND: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)          # int64: r * V passes 2^31 at ~14k rows of V = 151936
    row = z_ptr + r * V
    gi = tl.arange(0, TILE_GROUPS)
    ci = tl.arange(0, GROUP)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    for g0 in range(0, n_groups, TILE_GROUPS):
        gidx = g0 + gi
        ok = gidx < n_groups
        x = tl.load(row + gidx[:, None] * GROUP + ci[None, :], mask=ok[:, None], other=float("-inf")).to(tl.float32)
        gm = tl.max(x, axis=1)
        tl.store(gmax_ptr + r * n_groups + gidx, gm.to(gmax_ptr.dtype.element_ty), mask=ok)
        m_new = tl.maximum(m, tl.max(gm, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.sum(tl.exp(x - m_new), axis=1), axis=0)
        m = m_new
    lse = m + tl.log(s)
    tl.store(lse_ptr + r, lse)
    y = tl.load(y_ptr + r)
    c = tl.load(coef_ptr + r)
    cols = tl.arange(0, BLOCK)
    for v0 in range(0, V, BLOCK):
        v = v0 + cols
        ok = v < V
        x = tl.load(row + v, mask=ok, other=0.0).to(tl.float32)
        g = (tl.exp(x - lse) - tl.where(v == y, 1.0, 0.0)) * c
        tl.store(grad_ptr + r * V + v, round_to(g, KIND).to(grad_ptr.dtype.element_ty), mask=ok)
