# Norm-RoPE: per-head RMSNorm, then RoPE, of one token's heads, written where the attention reads it.
#
# One program per token (row b, position s) of x [B, S, H, hd] (hd contiguous): it loads the
# token's H heads as two halves [BLOCK_H, HALF] (the RoPE pairs element d with d + HALF), takes
# each head's mean of squares in fp32, and rounds where the reference's ops round, so that only
# the order of the mean's sum (and the rsqrt's last bit) differs from it:
#   normed = (x * rsqrt(mean + eps)) rounded to x's dtype   (fp32: 1 / sqrt, each correctly rounded)
#   y      = (w * normed) rounded
#   out1   = ((y1 * cos1) rounded + (-(y2 * sin1)) rounded) rounded      (rotate_half: [-y2, y1])
#   out2   = ((y2 * cos2) rounded + (y1 * sin2) rounded) rounded
# (products of two 16-bit floats are exact in fp32, so "rounded" is PyTorch's 16-bit op; `_round`
# rounds on the bits, to nearest even, and the value stays in fp32, so the final cast is exact). The
# result goes to out[b, h, slot, :], where slot = slots[b, s] (HAS_SLOTS: a cache) or s (a fresh
# [B, H, S, hd] tensor). With HAS_V the program also copies the token's value heads
# v[b, s, :, :] to v_out[b, :, slot, :] (a cache's values), so a layer's context or block keys and
# values reach the cache in one launch. `_norm_rope_pair_kernel` runs two such launches as one
# grid (an attention's keys and values into its cache, then its queries into a fresh tensor): a
# program below `n_first` runs a key token, the others a query token, each with its own launch's
# arguments, so every output has the bits of the separate launches.
import triton
import triton.language as tl

from dflash2.kernels.rounding import round_to as _round


@triton.jit
def _norm_rope_token(
    pid, x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, slot_ptr, v_ptr, vout_ptr,
    S, H, L, eps,
    s_xb, s_xs, s_xh, s_cb, s_cs, s_ob, s_oh, s_ol, s_pb, s_ps, s_vb, s_vs, s_vh, s_vob, s_voh, s_vol,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, KIND: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_V: tl.constexpr,
):
    """Token `pid` (= b * S + s) of x: its heads normed, rotated and stored (see the file's head)."""
    b = pid // S
    s = pid % S
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HALF)
    ok = (h[:, None] < H) & (d[None, :] < HALF)  # [BLOCK_H, HALF]
    x_base = x_ptr + b * s_xb + s * s_xs + h[:, None] * s_xh + d[None, :]
    x1 = tl.load(x_base, mask=ok, other=0.0)
    x2 = tl.load(x_base + HALF, mask=ok, other=0.0)
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    mean = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
    if KIND == 0:
        # fp32 output shows r's error directly: a correctly rounded root and quotient, not the
        # approximate rsqrt (the 1 as a block of the root's shape: div_rn's operands are blocks).
        r = tl.div_rn(tl.full([BLOCK_H], 1.0, tl.float32), tl.sqrt_rn(mean + eps))[:, None]
    else:
        # A 16-bit output rounds r's last fp32 bits away; the rsqrt torch's op uses keeps the bits.
        r = tl.math.rsqrt(mean + eps)[:, None]
    w1 = tl.load(w_ptr + d).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + HALF + d).to(tl.float32)[None, :]
    y1 = _round(w1 * _round(x1 * r, KIND), KIND)
    y2 = _round(w2 * _round(x2 * r, KIND), KIND)
    c_base = b * s_cb + s * s_cs + d
    c1 = tl.load(cos_ptr + c_base).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + c_base + HALF).to(tl.float32)[None, :]
    n1 = tl.load(sin_ptr + c_base).to(tl.float32)[None, :]
    n2 = tl.load(sin_ptr + c_base + HALF).to(tl.float32)[None, :]
    o1 = _round(_round(y1 * c1, KIND) + _round(-(y2 * n1), KIND), KIND).to(out_ptr.dtype.element_ty)
    o2 = _round(_round(y2 * c2, KIND) + _round(y1 * n2, KIND), KIND).to(out_ptr.dtype.element_ty)
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b * s_pb + s * s_ps)
    else:
        slot = s
    # A slot outside the cache is dropped, never written out of bounds (compared per lane: the
    # interpreter refuses a scalar condition in a tensor mask).
    lane_slot = slot + tl.zeros([BLOCK_H, HALF], dtype=tl.int32)
    ok = ok & (lane_slot >= 0) & (lane_slot < L)
    o_base = out_ptr + b * s_ob + h[:, None] * s_oh + slot * s_ol + d[None, :]
    tl.store(o_base, o1, mask=ok)
    tl.store(o_base + HALF, o2, mask=ok)
    if HAS_V:
        v_base = v_ptr + b * s_vb + s * s_vs + h[:, None] * s_vh + d[None, :]
        vo_base = vout_ptr + b * s_vob + h[:, None] * s_voh + slot * s_vol + d[None, :]
        tl.store(vo_base, tl.load(v_base, mask=ok, other=0.0).to(vout_ptr.dtype.element_ty), mask=ok)
        tl.store(vo_base + HALF, tl.load(v_base + HALF, mask=ok, other=0.0).to(vout_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["S", "L", "s_pb"])  # prompt / cache lengths: one binary for all
def _norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, slot_ptr, v_ptr, vout_ptr,
    S, H, L, eps,
    s_xb, s_xs, s_xh, s_cb, s_cs, s_ob, s_oh, s_ol, s_pb, s_ps, s_vb, s_vs, s_vh, s_vob, s_voh, s_vol,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, KIND: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_V: tl.constexpr,
):
    _norm_rope_token(tl.program_id(0), x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, slot_ptr, v_ptr, vout_ptr,
                     S, H, L, eps, s_xb, s_xs, s_xh, s_cb, s_cs, s_ob, s_oh, s_ol, s_pb, s_ps, s_vb, s_vs, s_vh,
                     s_vob, s_voh, s_vol, HALF, BLOCK_H, KIND, HAS_SLOTS, HAS_V)


@triton.jit(do_not_specialize=["n_first", "S_K", "L_K", "s_kpb", "S_Q", "L_Q"])  # as above
def _norm_rope_pair_kernel(
    n_first,
    # first: keys (and values) into a cache at slots; programs 0 .. n_first - 1
    k_ptr, kw_ptr, kcos_ptr, ksin_ptr, kout_ptr, kslot_ptr, kv_ptr, kvout_ptr,
    S_K, H_K, L_K, k_eps,
    s_kb, s_ks, s_kh, s_kcb, s_kcs, s_kob, s_koh, s_kol, s_kpb, s_kps, s_kvb, s_kvs, s_kvh, s_kvob, s_kvoh, s_kvol,
    # second: queries into a fresh [B, H_Q, S_Q, hd] tensor (no slots, no values); programs from n_first on
    q_ptr, qw_ptr, qcos_ptr, qsin_ptr, qout_ptr, qslot_ptr, qv_ptr, qvout_ptr,
    S_Q, H_Q, L_Q, q_eps,
    s_qb, s_qs, s_qh, s_qcb, s_qcs, s_qob, s_qoh, s_qol, s_qpb, s_qps, s_qvb, s_qvs, s_qvh, s_qvob, s_qvoh, s_qvol,
    HALF: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HQ: tl.constexpr, KIND: tl.constexpr,
):
    """The cache launch and the query launch of one attention as one grid: each program runs the
    token of the launch it falls in, with that launch's arguments (`_norm_rope_kernel`'s, in its
    order), so every output has the bits the two separate launches give it."""
    pid = tl.program_id(0)
    if pid < n_first:
        _norm_rope_token(pid, k_ptr, kw_ptr, kcos_ptr, ksin_ptr, kout_ptr, kslot_ptr, kv_ptr, kvout_ptr,
                         S_K, H_K, L_K, k_eps, s_kb, s_ks, s_kh, s_kcb, s_kcs, s_kob, s_koh, s_kol, s_kpb, s_kps,
                         s_kvb, s_kvs, s_kvh, s_kvob, s_kvoh, s_kvol, HALF, BLOCK_HK, KIND, True, True)
    else:
        _norm_rope_token(pid - n_first, q_ptr, qw_ptr, qcos_ptr, qsin_ptr, qout_ptr, qslot_ptr, qv_ptr, qvout_ptr,
                         S_Q, H_Q, L_Q, q_eps, s_qb, s_qs, s_qh, s_qcb, s_qcs, s_qob, s_qoh, s_qol, s_qpb, s_qps,
                         s_qvb, s_qvs, s_qvh, s_qvob, s_qvoh, s_qvol, HALF, BLOCK_HQ, KIND, False, False)
