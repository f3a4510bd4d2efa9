# Best-first token-tree expansion, one program per request: the whole loop of
# `reference.expand_reference` in registers. The frontier (FR >= budget * k entries: score, open,
# on-chain) and the node arrays (NB >= budget entries) are register vectors; each iteration picks
# the entry (chain first, else the highest score, ties -> lowest index), writes node i with
# `where(idx == i, ...)`, closes the entry and opens node i's k children (one masked load of
# their log-probabilities). Scalars are read out of vectors with a masked max/min.
import triton
import triton.language as tl


@triton.jit
def _expand_kernel(
    logp_ptr, cand_ptr, anchor_ptr, chain_ptr,
    tok_ptr, parent_ptr, depth_ptr, candout_ptr, score_ptr, valid_ptr, chainout_ptr,
    budget, n, k,
    s_lb, s_cb, s_chb, s_ob,
    FR: tl.constexpr, NB: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    fidx = tl.arange(0, FR)
    nidx = tl.arange(0, NB)
    neg_inf = float("-inf")
    anchor = tl.load(anchor_ptr + b)
    # node arrays (node 0 = root)
    n_tok = tl.zeros([NB], dtype=tl.int64) + anchor
    n_par = tl.zeros([NB], dtype=tl.int64) - 1
    n_dep = tl.zeros([NB], dtype=tl.int64)
    n_cand = tl.zeros([NB], dtype=tl.int64) - 1
    n_score = tl.where(nidx == 0, 0.0, neg_inf)
    n_valid = nidx == 0
    n_chain = nidx == 0
    # root's children: slot 0 (predecessor row 0; every row of slot 0 is the same)
    lane = fidx
    root_open = fidx < tl.minimum(n, 1) * k  # slot 0's k candidates (none without slots)
    f_score = tl.load(logp_ptr + b * s_lb + lane, mask=root_open, other=neg_inf)
    f_score = tl.where(root_open, f_score, neg_inf)
    f_open = root_open
    c0 = tl.load(chain_ptr + b * s_chb)  # the launcher gives every tensor >= 1 slot
    f_chain = root_open & (lane == c0)
    for i in range(1, budget):
        sc = tl.where(f_open, f_score, neg_inf)
        chain_open = f_open & f_chain
        any_chain = tl.max(chain_open.to(tl.int32), 0) > 0
        m = tl.max(sc, 0)
        best = f_open & (sc == m)
        any_best = tl.max(best.to(tl.int32), 0) > 0
        best = tl.where(any_best, best, f_open)
        pick = tl.where(any_chain, chain_open, best)
        ok = tl.max(f_open.to(tl.int32), 0) > 0
        f = tl.min(tl.where(pick, fidx, FR), 0)
        f = tl.where(ok, f, 0)
        par = (f // k).to(tl.int64)
        c = (f % k).to(tl.int64)
        d = tl.max(tl.where(nidx == par, n_dep, -1), 0) + 1
        slot = tl.minimum(tl.maximum(d - 1, 0), tl.maximum(n - 1, 0))
        tok = tl.load(cand_ptr + b * s_cb + slot * k + c)  # in bounds: slot < max(n, 1), c < k
        sc_f = tl.max(tl.where(fidx == f, f_score, neg_inf), 0)
        ch_f = tl.max(tl.where(fidx == f, chain_open.to(tl.int32), 0), 0) > 0
        at = nidx == i
        n_tok = tl.where(at, tl.where(ok, tok, anchor), n_tok)
        n_par = tl.where(at, tl.where(ok, par, -1), n_par)
        n_dep = tl.where(at, tl.where(ok, d, 0), n_dep)
        n_cand = tl.where(at, tl.where(ok, c, -1), n_cand)
        n_score = tl.where(at, tl.where(ok, sc_f, neg_inf), n_score)
        n_valid = tl.where(at, ok, n_valid)
        n_chain = tl.where(at, ok & ch_f, n_chain)
        f_open = f_open & ~((fidx == f) & ok)
        # node i's children: candidates of slot d (its own depth), scored from its candidate c
        can = ok & (d < n)
        seg = (fidx >= i * k) & (fidx < i * k + k)
        ln = fidx - i * k
        ds = tl.minimum(d, tl.maximum(n - 1, 0))
        open_seg = seg & ((fidx * 0 + can.to(tl.int32)) > 0)  # a vector mask (the interpreter wants one)
        child = tl.load(logp_ptr + b * s_lb + ds * k * k + c * k + ln, mask=open_seg, other=neg_inf)
        f_score = tl.where(seg, tl.where(open_seg, sc_f + child, neg_inf), f_score)
        f_open = tl.where(seg, open_seg, f_open)
        nc = tl.load(chain_ptr + b * s_chb + ds)
        f_chain = tl.where(seg, open_seg & ch_f & (ln == nc), f_chain)
    live = nidx < budget
    o = b * s_ob + nidx
    tl.store(tok_ptr + o, n_tok, mask=live)
    tl.store(parent_ptr + o, n_par, mask=live)
    tl.store(depth_ptr + o, n_dep, mask=live)
    tl.store(candout_ptr + o, n_cand, mask=live)
    tl.store(score_ptr + o, n_score, mask=live)
    tl.store(valid_ptr + o, n_valid.to(tl.int8), mask=live)
    tl.store(chainout_ptr + o, n_chain.to(tl.int8), mask=live)
