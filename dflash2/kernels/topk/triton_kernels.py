# Vocabulary top-k, two launches:
#
#   value[v] = softcap(multiplier * logit[v])            (fp32; softcap s: s * tanh(x / s))
#   key[v]   = ord(value[v]) * 2^32 + (2^32 - 1 - v)     (int64; one max = argmax with ties -> lowest v)
#
# where ord() maps fp32 bits to a signed int32 of the same order (negative floats get their low
# 31 bits flipped; -0.0 is folded onto +0.0). Keys are unique, so any top-k of keys is exact.
#
# Stage 1, one program per (row, chunk of NG*S entries): view the chunk as NG groups of S
# entries. Rank the groups by (max ordered value, lowest group id first), computed in int32; the
# chunk's top-k entries all lie in the k best groups (each better group holds an entry that beats
# any entry of a worse group, ties included), so take the KP >= k best groups with one bitonic
# tl.topk over the NG group keys, reload those KP groups (KP*S int64 keys, cache-hot) and take
# tl.topk of them. Stage 2, one program per row: tl.topk over the n_chunks*KP partial keys, decode.
# KP = next power of two >= k (tl.topk needs one); keys are unique, so the first k are the top-k.
#
# Validity (INVALID), from the raw logits x of stage 1's full load (masked lanes count as 0):
#
#   state[x] = 2 if x is NaN (x != x) or +inf,  1 if x > -inf,  0 if x == -inf
#   state[row, chunk] = max over the chunk's entries;  invalid[row] = (max over chunks != 1)
#
# A row's max state is 2 iff it holds a NaN or a +inf, 0 iff every entry is -inf, 1 otherwise,
# so invalid[row] == ~isfinite(amax(logits[row])). Stage 1 stores its int8 state per (row, chunk);
# stage 2 reduces the row's n_chunks states.
import triton
import triton.language as tl

_SENT = tl.constexpr(-9223372036854775808)  # int64 min: below every encoded key


@triton.jit
def _encode_key(value, index):
    # value fp32, index int -> int64 order-preserving composite key.
    return _ordered(value).to(tl.int64) * 4294967296 + (4294967295 - index.to(tl.int64))


@triton.jit
def _decode_key(key):
    ordered = (key >> 32).to(tl.int32)
    bits = ordered ^ ((ordered >> 31) & 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True), 4294967295 - (key & 4294967295)


@triton.jit
def _tanh(y):
    # fp32 tanh without libdevice (the interpreter has none): odd minimax-style polynomial
    # (fitted by us on [0, 0.625], ~1.3 ulp) near 0, where 1 - 2/(e^2a + 1) cancels; that form
    # (~2.5 ulp) beyond.
    a = tl.abs(y)
    z = y * y
    p = -0.0057189627550542355 * z + 0.020653124898672104
    p = p * z - 0.05374465882778168
    p = p * z + 0.13331513106822968
    p = p * z - 0.3333328664302826
    small = y + y * z * p
    big = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    big = tl.where(y < 0, -big, big)
    return tl.where(a < 0.625, small, big)


@triton.jit
def _head_value(x, multiplier, softcap, SOFTCAP: tl.constexpr):
    v = x.to(tl.float32) * multiplier
    if SOFTCAP:
        v = softcap * _tanh(v / softcap)
    return v


@triton.jit
def _ordered(value):
    # fp32 -> int32 of the same order (-0.0 folded onto +0.0): the high half of a key.
    bits = value.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return tl.where(value == 0.0, 0, ordered)


@triton.jit
def _validity_state(x, ok):
    # Raw logits -> 2 (NaN or +inf), 1 (> -inf), 0 (-inf or masked off). Compared exactly: 16-bit
    # and fp32 widen to fp32 without rounding (the conversion _head_value makes anyway; the
    # interpreter also compares bf16 wrongly), fp64 stays fp64 (fp32 would round 1e300 to inf).
    if x.dtype != tl.float64:
        x = x.to(tl.float32)
    bad = (x != x) | (x == float("inf"))
    return tl.where(ok, tl.where(bad, 2, tl.where(x > float("-inf"), 1, 0)), 0)


@triton.jit
def _topk_chunk_kernel(
    x_ptr, part_ptr, state_ptr, V, stride_xm, n_chunks, multiplier, softcap,
    KP: tl.constexpr, NG: tl.constexpr, S: tl.constexpr, SOFTCAP: tl.constexpr, INVALID: tl.constexpr,
):
    # state_ptr: int8 [M, n_chunks], written only when INVALID (may be None otherwise).
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    start = chunk * (NG * S)
    row_ptr = x_ptr + row.to(tl.int64) * stride_xm
    g = tl.arange(0, NG)
    s = tl.arange(0, S)
    offs = start + g[:, None] * S + s[None, :]  # [NG, S]
    ok = offs < V
    x = tl.load(row_ptr + offs, mask=ok, other=0.0)
    if INVALID:  # from the raw logits of this full load (the second load reads KP groups only)
        state = tl.max(tl.max(_validity_state(x, ok), axis=1), axis=0)
        tl.store(state_ptr + row.to(tl.int64) * n_chunks + chunk, state.to(tl.int8))
    # Group key = (max ordered value of the group, then lowest group id): int32 work per entry.
    o = tl.where(ok, _ordered(_head_value(x, multiplier, softcap, SOFTCAP)), -2147483648)
    gkey = tl.max(o, axis=1).to(tl.int64) * 4294967296 + (4294967295 - g.to(tl.int64))
    top = tl.topk(gkey, KP)  # the KP best groups, as bitonic top-k (no serial rounds)
    sel = (4294967295 - (top & 4294967295)).to(tl.int32)
    offs2 = start + sel[:, None] * S + s[None, :]  # [KP, S]
    ok2 = offs2 < V  # groups past V (selected only when fewer than KP exist) load nothing
    x2 = tl.load(row_ptr + offs2, mask=ok2, other=0.0)
    keys2 = tl.where(ok2, _encode_key(_head_value(x2, multiplier, softcap, SOFTCAP), offs2), _SENT)
    best = tl.topk(tl.reshape(keys2, [KP * S]), KP)
    kk = tl.arange(0, KP)
    tl.store(part_ptr + (row.to(tl.int64) * n_chunks + chunk) * KP + kk, best)


@triton.jit
def _topk_merge_kernel(
    part_ptr, val_ptr, idx_ptr, state_ptr, inv_ptr, n_part, n_chunks, stride_vm, stride_im,
    K: tl.constexpr, KP: tl.constexpr, NPART: tl.constexpr, NCH: tl.constexpr, INVALID: tl.constexpr,
):
    # state_ptr: int8 [M, n_chunks] from stage 1, inv_ptr: bool [M]; used only when INVALID.
    row = tl.program_id(0)
    offs = tl.arange(0, NPART)
    keys = tl.load(part_ptr + row.to(tl.int64) * n_part + offs, mask=offs < n_part, other=_SENT)
    best = tl.topk(keys, KP)
    kk = tl.arange(0, KP)
    val, idx = _decode_key(best)
    tl.store(val_ptr + row.to(tl.int64) * stride_vm + kk, val, mask=kk < K)
    tl.store(idx_ptr + row.to(tl.int64) * stride_im + kk, idx, mask=kk < K)
    if INVALID:
        c = tl.arange(0, NCH)
        state = tl.load(state_ptr + row.to(tl.int64) * n_chunks + c, mask=c < n_chunks, other=0)
        tl.store(inv_ptr + row, tl.max(state.to(tl.int32), axis=0) != 1)
