# Grouped dynamic depthwise causal conv, forward (spec 4.2, one side per launch):
#
#   out[b, i, c] = sum_{t < K} [i mod L >= t] * (base[side, t, c] + proj[b, i, side*K*G + t*G + c//g])
#                                             * z[b, i - t, c]
#
# One program owns a [BLOCK_T tokens, BLOCK_H channels] tile of one sequence; the K taps re-read
# the z rows i-t (L1/L2 hits). Accumulation in fp32, output in z's dtype, rounded to nearest even
# (`round_to`, also in the interpreter). With HAS_RES the epilogue adds a residual r the way
# `r + out` does in PyTorch: the conv rounded to the output dtype first, then the sum of the two
# in fp32, rounded once (the same bits as the conv's launch followed by PyTorch's add).
#
# The conv + residual + RMSNorm kernel (`_grouped_dynamic_conv_norm_fwd`) runs the same tile
# function, `_conv_tile`, over one token row, so its `out` has the bits of the conv's launch, and
# then normalizes that row as Qwen3RMSNorm does:
#
#   ms     = sum_c out[c]^2 / H                        (fp32; the sum in chunk order, then a tree)
#   r      = rsqrt(ms + eps)                           (fp32 output: 1 / sqrt, each correctly rounded)
#   normed = (w * (out * r) rounded to dtype) rounded  (products of 16-bit values are exact in fp32)
import triton
import triton.language as tl

from dflash2.kernels.rounding import round_to


@triton.jit
def _conv_tile(
    z_ptr, base_ptr, proj_ptr, res_ptr, b, i, c, T, H, L, side,
    stride_zb, stride_zt, stride_zh,
    stride_bs, stride_bt, stride_bh,
    stride_pb, stride_pt, stride_pj,
    stride_rb, stride_rt, stride_rh,
    K: tl.constexpr, G: tl.constexpr, GROUP: tl.constexpr, HAS_RES: tl.constexpr, KIND: tl.constexpr,
):
    """The conv (plus the residual with HAS_RES) at tokens `i [BT]` x channels `c [BH]` of row `b`:
    `(y, ok)`, y [BT, BH] fp32 holding the output dtype's value (0 where masked), ok its mask."""
    i_ok = i < T
    c_ok = c < H
    in_block = i % L
    grp = c // GROUP  # [BH] kernel group of each channel
    z_base = z_ptr + b.to(tl.int64) * stride_zb
    p_base = proj_ptr + b.to(tl.int64) * stride_pb
    acc = tl.zeros((i.shape[0], c.shape[0]), dtype=tl.float32)
    for t in tl.static_range(K):
        ok = (i_ok & (in_block >= t))[:, None] & c_ok[None, :]  # [BT, BH]
        zt = tl.load(z_base + (i - t)[:, None] * stride_zt + c[None, :] * stride_zh, mask=ok, other=0.0)
        w0 = tl.load(base_ptr + side * stride_bs + t * stride_bt + c * stride_bh, mask=c_ok, other=0.0)
        col = side * (K * G) + t * G + grp  # [BH] row index into the flat projection output
        dw = tl.load(p_base + i[:, None] * stride_pt + col[None, :] * stride_pj, mask=ok, other=0.0)
        acc += (w0.to(tl.float32)[None, :] + dw.to(tl.float32)) * zt.to(tl.float32)
    out_ok = i_ok[:, None] & c_ok[None, :]
    y = round_to(acc, KIND)  # fp32 holding the output dtype's value
    if HAS_RES:
        r_ptrs = res_ptr + b.to(tl.int64) * stride_rb + i[:, None] * stride_rt + c[None, :] * stride_rh
        r = tl.load(r_ptrs, mask=out_ok, other=0.0)
        y = round_to(r.to(tl.float32) + y, KIND)
    return y, out_ok


@triton.jit
def _grouped_dynamic_conv_fwd(
    z_ptr, base_ptr, proj_ptr, out_ptr, res_ptr,
    T, H, L, side,
    stride_zb, stride_zt, stride_zh,
    stride_bs, stride_bt, stride_bh,
    stride_pb, stride_pt, stride_pj,
    stride_ob, stride_ot, stride_oh,
    stride_rb, stride_rt, stride_rh,
    K: tl.constexpr, G: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, HAS_RES: tl.constexpr, KIND: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    b = tl.program_id(2)
    i = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)  # [BT] token index in the sequence
    c = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)  # [BH] channel
    y, out_ok = _conv_tile(
        z_ptr, base_ptr, proj_ptr, res_ptr, b, i, c, T, H, L, side,
        stride_zb, stride_zt, stride_zh, stride_bs, stride_bt, stride_bh,
        stride_pb, stride_pt, stride_pj, stride_rb, stride_rt, stride_rh,
        K, G, GROUP, HAS_RES, KIND,
    )
    o_ptrs = out_ptr + b.to(tl.int64) * stride_ob + i[:, None] * stride_ot + c[None, :] * stride_oh
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_ok)


@triton.jit
def _normalize(y, ss, H, eps, w, KIND: tl.constexpr):
    """Qwen3RMSNorm of `y [1, BH]` (fp32 holding the dtype's values) given its row's sum of
    squares `ss [1]` and the weight `w [1, BH]` (fp32): `(w * (y * rsqrt(ss / H + eps)) rounded)
    rounded`, in fp32."""
    mean = tl.div_rn(ss, tl.zeros_like(ss) + H)  # [1]
    if KIND == 0:
        # fp32 output shows r's error directly: a correctly rounded root and quotient (as torch's
        # CPU rsqrt), not the approximate rsqrt.
        r = tl.div_rn(tl.zeros_like(mean) + 1.0, tl.sqrt_rn(mean + eps))[:, None]
    else:
        # A 16-bit output rounds r's last fp32 bits away; the rsqrt torch's CUDA op uses.
        r = tl.math.rsqrt(mean + eps)[:, None]
    return round_to(w * round_to(y * r, KIND), KIND)


@triton.jit
def _grouped_dynamic_conv_norm_fwd(
    z_ptr, base_ptr, proj_ptr, res_ptr, w_ptr, out_ptr, normed_ptr,
    T, H, L, side, eps,
    stride_zb, stride_zt, stride_zh,
    stride_bs, stride_bt, stride_bh,
    stride_pb, stride_pt, stride_pj,
    stride_rb, stride_rt, stride_rh,
    stride_w,
    stride_ob, stride_ot, stride_oh,
    stride_nb, stride_nt, stride_nh,
    K: tl.constexpr, G: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr, CHUNKS: tl.constexpr, KIND: tl.constexpr,
):
    # One program per token row (i, b), its H channels in CHUNKS chunks of BLOCK_H. Pass 1: the
    # conv + residual of each chunk (`_conv_tile`, the conv launch's bits), stored, and the fp32
    # sum of squares of the stored values. Pass 2: the norm of each chunk; one chunk stays in
    # registers, several are read back from `out` (this program's own writes, after a barrier).
    i = tl.program_id(0) + tl.arange(0, 1)  # [1] this program's token
    b = tl.program_id(1)
    o_row = out_ptr + b.to(tl.int64) * stride_ob + i[:, None] * stride_ot
    n_row = normed_ptr + b.to(tl.int64) * stride_nb + i[:, None] * stride_nt
    ss = tl.zeros((1,), dtype=tl.float32)
    if CHUNKS == 1:
        c = tl.arange(0, BLOCK_H)
        # the weight first: its load overlaps the conv's instead of following the row's sum
        w = tl.load(w_ptr + c * stride_w, mask=c < H, other=0.0).to(tl.float32)[None, :]
        y, ok = _conv_tile(
            z_ptr, base_ptr, proj_ptr, res_ptr, b, i, c, T, H, L, side,
            stride_zb, stride_zt, stride_zh, stride_bs, stride_bt, stride_bh,
            stride_pb, stride_pt, stride_pj, stride_rb, stride_rt, stride_rh,
            K, G, GROUP, True, KIND,
        )
        tl.store(o_row + c[None, :] * stride_oh, y.to(out_ptr.dtype.element_ty), mask=ok)
        ss += tl.sum(y * y, axis=1)  # masked lanes hold 0
        n = _normalize(y, ss, H, eps, w, KIND)
        tl.store(n_row + c[None, :] * stride_nh, n.to(normed_ptr.dtype.element_ty), mask=ok)
    else:
        for h in tl.static_range(CHUNKS):
            c = h * BLOCK_H + tl.arange(0, BLOCK_H)
            y, ok = _conv_tile(
                z_ptr, base_ptr, proj_ptr, res_ptr, b, i, c, T, H, L, side,
                stride_zb, stride_zt, stride_zh, stride_bs, stride_bt, stride_bh,
                stride_pb, stride_pt, stride_pj, stride_rb, stride_rt, stride_rh,
                K, G, GROUP, True, KIND,
            )
            tl.store(o_row + c[None, :] * stride_oh, y.to(out_ptr.dtype.element_ty), mask=ok)
            ss += tl.sum(y * y, axis=1)
        tl.debug_barrier()  # the stores above are visible to every thread of the program
        for h in tl.static_range(CHUNKS):
            c = h * BLOCK_H + tl.arange(0, BLOCK_H)
            ok = (c < H)[None, :]
            y = tl.load(o_row + c[None, :] * stride_oh, mask=ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c * stride_w, mask=c < H, other=0.0).to(tl.float32)[None, :]
            n = _normalize(y, ss, H, eps, w, KIND)
            tl.store(n_row + c[None, :] * stride_nh, n.to(normed_ptr.dtype.element_ty), mask=ok)
