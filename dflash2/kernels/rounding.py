"""Rounding to a model dtype inside Triton kernels, the same on the GPU and in the interpreter.

`round_to(x, KIND)`: fp32 `x` rounded to nearest, ties to even, in the dtype KIND names (0 fp32,
as is; 1 bf16, on the bits; 2 fp16), the value kept in fp32, so that a later cast to that dtype
is exact. bf16 is rounded on the bits because the Triton interpreter's fp32 -> bf16 cast
truncates; on the GPU the result equals the cast's for every finite value and infinity (a NaN
whose payload lies only in the low 16 bits becomes an infinity, which the engine's invalid-row
check treats as it treats a NaN). It needs Triton: the kernels' `triton_kernels` modules import
`round_to`, and their launchers import `ROUNDING_KIND` (dtype -> KIND) in the same guarded import.
"""

import torch
import triton
import triton.language as tl

ROUNDING_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@triton.jit
def round_to(x, KIND: tl.constexpr):
    """fp32 `x` rounded to the dtype KIND names and kept in fp32 (see the module docstring)."""
    if KIND == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # shifts keep it 32-bit
        y = bits.to(tl.float32, bitcast=True)
    elif KIND == 2:
        y = x.to(tl.float16).to(tl.float32)
    else:
        y = x
    return y
