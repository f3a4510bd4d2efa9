"""Counter-based keyed RNG shared by the torch references and the Triton kernels.

A uniform is a pure function of ``(seed, stream, position, index)``: no generator state, so the
same key gives the same number on any device, in any batch layout, inside or outside a CUDA
graph. The torch function and the ``@triton.jit`` twin are bit-identical.

Hash (all arithmetic is 32-bit wrapping; in torch it runs on int64 and is masked with
``0xFFFFFFFF`` after every add and multiply, which never overflows because every value is
< 2^32 and every multiplier is an odd constant < 2^31, so products stay < 2^63):

    mix(x)   = x ^= x >> 16; x *= M1; x ^= x >> 15; x *= M2; x ^= x >> 16     (a bijection)
    prefix   = mix(mix(mix(mix(mix(lo(seed) + C0) ^ hi(seed)) ^ stream) ^ lo(pos)) ^ hi(pos))
    h        = mix(mix(prefix ^ index) + C1)
    uniform  = ((h >> 9) + 0.5) * 2^-23          in [2^-24, 1 - 2^-24], exactly representable

Why 23 bits and not ``((h >> 8) + 0.5) * 2^-24``: with 24 bits, ``m + 0.5`` needs 25
significant bits, so fp32 rounds the top value to exactly 1.0 (and others to even
neighbours); u = 1 gives E = -log(u) = 0 and breaks the exponential race. 23 bits keeps every
uniform exact in fp32 and strictly inside (0, 1).

Streams are disjoint by construction: every mix step is a bijection of the running state, and
XOR with a fixed word is a bijection too, so for a fixed (seed, position, index) the map
stream -> h is injective. The DRAFT, ACCEPT and TARGET streams therefore never yield the same
32-bit value for the same counter (the coupling bug of spec section 8 / vllm#54282).
"""

from __future__ import annotations

import torch

# Stream words (arbitrary distinct 32-bit constants).
DRAFT_STREAM = 0x1D2A_F701  # selector walk: Gumbel noise keyed (seed, position, candidate id)
ACCEPT_STREAM = 0x2B7E_1516  # verify: acceptance uniform keyed (seed, position, 0)
TARGET_STREAM = 0x3C4F_A9E5  # verify: residual / bonus race keyed (seed, position, vocab id)

_M1 = 0x7FEB352D
_M2 = 0x2C1B3C6D
_C0 = 0x1B873593
_C1 = 0x68E31DA4
_MASK = 0xFFFFFFFF
_INV_2_23 = 2.0**-23


def _mix_torch(x):
    # Works on int64 tensors and on Python ints alike (no host-to-device copies: graph-safe).
    x = x ^ (x >> 16)
    x = (x * _M1) & _MASK
    x = x ^ (x >> 15)
    x = (x * _M2) & _MASK
    return x ^ (x >> 16)


def _as_int64(x):
    return x.long() if isinstance(x, torch.Tensor) else int(x)


def key_prefix(seed: torch.Tensor | int, stream: int, position: torch.Tensor | int) -> torch.Tensor | int:
    """32-bit hash state of ``(seed, stream, position)``, in [0, 2^32) (int64 tensor or int)."""
    seed, position = _as_int64(seed), _as_int64(position)
    h = _mix_torch(((seed & _MASK) + _C0) & _MASK)
    h = _mix_torch(h ^ ((seed >> 32) & _MASK))  # >> is arithmetic: & keeps the high word's bits
    h = _mix_torch(h ^ (stream & _MASK))
    h = _mix_torch(h ^ (position & _MASK))
    return _mix_torch(h ^ ((position >> 32) & _MASK))


def uniform_from_prefix(prefix: torch.Tensor | int, index: torch.Tensor | int) -> torch.Tensor:
    """fp32 uniforms in (0, 1) for ``index`` (int, 0 <= index < 2^32) under a :func:`key_prefix`."""
    h = _mix_torch((_mix_torch(prefix ^ (_as_int64(index) & _MASK)) + _C1) & _MASK)
    if not isinstance(h, torch.Tensor):
        h = torch.tensor(h, dtype=torch.int64)
    return ((h >> 9).to(torch.float32) + 0.5) * _INV_2_23


def keyed_uniform(
    seed: torch.Tensor | int,
    stream: int,
    position: torch.Tensor | int,
    index: torch.Tensor | int,
) -> torch.Tensor:
    """Uniforms in (0, 1), fp32, one per broadcast element of ``(seed, position, index)``.

    Args:
        seed: int64 tensor or int (any 64-bit value).
        stream: one of ``DRAFT_STREAM``, ``ACCEPT_STREAM``, ``TARGET_STREAM``.
        position: int64 tensor or int (absolute token position, >= 0).
        index: int64 tensor or int in [0, 2^32) (vocabulary id, candidate token id or 0).

    Returns:
        fp32 tensor of the broadcast shape of the three inputs, bit-identical to the Triton
        twin (:func:`key_prefix_tl` + :func:`uniform_from_prefix_tl`).
    """
    return uniform_from_prefix(key_prefix(seed, stream, position), index)


try:  # the Triton twin; absent when triton is not installed (the torch path still works)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None

if triton is not None:

    @triton.jit
    def _mix_tl(x):
        # x: uint32; multiplication and shifts wrap / are logical on uint32.
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x2C1B3C6D
        return x ^ (x >> 16)

    @triton.jit
    def key_prefix_tl(seed, stream, position):
        """Triton twin of :func:`key_prefix`: seed/position int64 (scalar or tensor) -> uint32."""
        seed = seed.to(tl.int64)
        position = position.to(tl.int64)
        h = _mix_tl(seed.to(tl.uint32) + 0x1B873593)
        h = _mix_tl(h ^ (seed >> 32).to(tl.uint32))
        h = _mix_tl(h ^ stream)
        h = _mix_tl(h ^ position.to(tl.uint32))
        return _mix_tl(h ^ (position >> 32).to(tl.uint32))

    @triton.jit
    def uniform_from_prefix_tl(prefix, index):
        """Triton twin of :func:`uniform_from_prefix`: uint32 prefix, integer index -> fp32."""
        h = _mix_tl(_mix_tl(prefix ^ index.to(tl.uint32)) + 0x68E31DA4)
        return ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07

    @triton.jit
    def _keyed_uniform_kernel(seed_ptr, pos_ptr, idx_ptr, out_ptr, n, stream, BLOCK: tl.constexpr):
        # Test/utility kernel: out[i] = keyed_uniform(seed[i], stream, pos[i], idx[i]).
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        seed = tl.load(seed_ptr + offs, mask=m, other=0)
        pos = tl.load(pos_ptr + offs, mask=m, other=0)
        idx = tl.load(idx_ptr + offs, mask=m, other=0)
        u = uniform_from_prefix_tl(key_prefix_tl(seed, stream.to(tl.uint32), pos), idx)
        tl.store(out_ptr + offs, u, mask=m)


def keyed_uniform_triton(
    seed: torch.Tensor, stream: int, position: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    """Run the Triton twin elementwise over broadcast int64 tensors (used by tests and bench)."""
    if triton is None:
        raise RuntimeError("keyed_uniform_triton needs the 'triton' package (`pip install triton`).")
    seed, position, index = torch.broadcast_tensors(
        torch.as_tensor(seed, dtype=torch.int64),
        torch.as_tensor(position, dtype=torch.int64),
        torch.as_tensor(index, dtype=torch.int64),
    )
    shape = seed.shape
    seed, position, index = (t.contiguous().view(-1) for t in (seed, position, index))
    out = torch.empty(seed.shape, dtype=torch.float32, device=seed.device)
    n = seed.numel()
    block = 1024
    _keyed_uniform_kernel[(triton.cdiv(n, block),)](seed, position, index, out, n, stream, BLOCK=block)
    return out.view(shape)
