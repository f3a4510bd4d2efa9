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
import triton
import triton.language as tl

from dflash2.kernels.rounding import round_to


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
    i_ok = i < T
    c_ok = c < H
    in_block = i % L
    grp = c // GROUP  # [BH] kernel group of each channel
    z_base = z_ptr + b.to(tl.int64) * stride_zb
    p_base = proj_ptr + b.to(tl.int64) * stride_pb
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for t in tl.static_range(K):
        ok = (i_ok & (in_block >= t))[:, None] & c_ok[None, :]  # [BT, BH]
        zt = tl.load(z_base + (i - t)[:, None] * stride_zt + c[None, :] * stride_zh, mask=ok, other=0.0)
        w0 = tl.load(base_ptr + side * stride_bs + t * stride_bt + c * stride_bh, mask=c_ok, other=0.0)
        col = side * (K * G) + t * G + grp  # [BH] row index into the flat projection output
        dw = tl.load(p_base + i[:, None] * stride_pt + col[None, :] * stride_pj, mask=ok, other=0.0)
        acc += (w0.to(tl.float32)[None, :] + dw.to(tl.float32)) * zt.to(tl.float32)
    out_ok = i_ok[:, None] & c_ok[None, :]
    o_ptrs = out_ptr + b.to(tl.int64) * stride_ob + i[:, None] * stride_ot + c[None, :] * stride_oh
    y = round_to(acc, KIND)  # fp32 holding the output dtype's value
    if HAS_RES:
        r_ptrs = res_ptr + b.to(tl.int64) * stride_rb + i[:, None] * stride_rt + c[None, :] * stride_rh
        r = tl.load(r_ptrs, mask=out_ok, other=0.0)
        y = round_to(r.to(tl.float32) + y, KIND)
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_ok)
