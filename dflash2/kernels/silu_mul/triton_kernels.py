# silu(gate) * up, one program per (row, block of columns):
#
#   s   = round(g / (1 + exp(-g)))      fp32 on the widened gate, rounded to the dtype
#   out = round(s * u)                  fp32 product of the widened operands, rounded
#
# the two roundings of eager PyTorch (`F.silu(gate) * up`).
import triton
import triton.language as tl

from dflash2.kernels.rounding import round_to


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, n_cols, stride_g, stride_u, stride_o,
                     BLOCK: tl.constexpr, KIND: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(g_ptr + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
    s = round_to(g / (1.0 + tl.exp(-g)), KIND)
    out = round_to(s * u, KIND)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=ok)
