"""Compile every Triton kernel of `dflash2.kernels` for the H200 (sm_90) on a machine without a GPU.

Run as a script in a process without ``TRITON_INTERPRET`` (the interpreter replaces the JIT
functions): ``python tests/kernels/sm90_compile.py`` prints one JSON line per launch and exits
non-zero if any launch fails; ``--selftest`` runs two launches that must fail instead. Each case
calls a kernel's Triton wrapper at the shapes and dtypes the engine runs (the Qwen3-8B and
SmolLM2-135M targets, their drafts, exact mode), with every ``kernel[grid](...)`` launch
captured instead of run; each captured launch is then compiled with ``triton.compile`` for
``GPUTarget("cuda", 90, 32)`` down to a cubin (ptxas included), with the launch's constexprs and
its ``num_warps`` / ``num_stages``. The wrappers' CPU-only choices are set back to the GPU's
(`GPU_CONSTEXPRS`: the linear's ``WIDEN`` and ``IEEE`` for 16-bit operands off, the verify's
``FAST_LOG`` on), and a case can ask for more (``PDL``, as `SmallMLinearMode(pdl=True)` runs).

What this shows: the kernels compile for Hopper at those settings and with the runtime's
divisibility-by-16 specializations of their arguments, and each one's static shared memory fits
the H200's 227 KiB per block; each row counts the 16-byte asynchronous copies in the PTX
(`async_copies`, the pipelined tile loads). What it does not: numerics (the interpreter tests and
the GPU tests), and the runtime's specialization of integer arguments equal to 1.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time

H200_SHARED_BYTES = 232448  # 227 KiB: the opt-in maximum of shared memory per block on sm_90

_TYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.int64": "i64",
          "torch.int32": "i32", "torch.int8": "i8", "torch.uint8": "u8", "torch.bool": "i1"}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _arg_type(value) -> str | None:
    """Triton signature type of a runtime argument; None: a constexpr (None values are)."""
    import torch

    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[str(value.dtype)]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


# The wrappers' device-dependent constexprs, as on a GPU: the linear widens 16-bit operands to
# fp32 only in the interpreter (and takes IEEE products only for fp32 then); the verify's fast
# log runs on CUDA.
GPU_CONSTEXPRS = {
    "_small_m_linear_kernel": lambda c: {"WIDEN": False, "IEEE": bool(c["IEEE"]) and not c["WIDEN"]},
    "_verify_stats_kernel": lambda c: {"FAST_LOG": True},
}


def capture(call) -> list[tuple]:
    """`(jit_fn, args, kwargs)` of every Triton launch that `call()` makes, none of them run."""
    from triton.runtime.jit import KernelInterface

    launches = []
    original = KernelInterface.__getitem__
    KernelInterface.__getitem__ = lambda self, grid: (lambda *a, **kw: launches.append((self, a, kw)))
    try:
        call()
    finally:
        KernelInterface.__getitem__ = original
    return launches


def _divisible_by_16(value) -> bool:
    """Whether Triton's launcher would mark this argument divisible by 16: a tensor whose data
    pointer is 16-byte aligned, an int (not a bool) that is a multiple of 16."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


def compile_launch(fn, args: tuple, kwargs: dict, overrides: dict | None = None):
    """The launch compiled for sm_90, with `GPU_CONSTEXPRS` and the case's `overrides` (constexprs
    the wrapper sets from the device it sees), and the divisibility-by-16 specializations the
    runtime gives its arguments (they decide vectorized loads and pipelining, so the shared
    memory too): `(name, constexprs shown, metadata, PTX text)`."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = fn.fn.__name__
    params = list(inspect.signature(fn.fn).parameters)
    bound = dict(zip(params, args))
    options = {k: kwargs.pop(k) for k in _LAUNCH_OPTIONS if k in kwargs}
    pdl = bool(kwargs.pop("launch_pdl", False))
    bound.update(kwargs)
    constexpr_names = {p.name for p in fn.params if p.is_constexpr}
    unspecialized = {p.name for p in fn.params if p.do_not_specialize}
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(params):
        value = bound[p]
        kind = None if p in constexpr_names else _arg_type(value)
        if kind is None:
            constexprs[p] = value
            signature[p] = "constexpr"
        else:
            signature[p] = kind
            if _divisible_by_16(value) and p not in unspecialized:  # as the runtime specializes
                attrs[(i,)] = [["tt.divisibility", 16]]
    fix = GPU_CONSTEXPRS.get(name)
    for k, v in {**(fix(constexprs) if fix else {}), **(overrides or {})}.items():
        if k in constexprs:
            constexprs[k] = v
    pdl = bool(constexprs.get("PDL", pdl))
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    shown = {k: v for k, v in constexprs.items() if isinstance(v, (int, float, bool)) and not isinstance(v, type)}
    return name, {**shown, **options, "pdl": pdl}, kernel.metadata, kernel.asm["ptx"]


def cases():
    """(label, zero-argument call of a Triton wrapper, constexpr overrides) at the engine's shapes."""
    import torch

    from dflash2.kernels.dynamic_conv import _grouped_dynamic_conv_norm_triton, _grouped_dynamic_conv_triton
    from dflash2.kernels.head_ce import _launch as _head_ce_triton
    from dflash2.kernels.keyed_random import keyed_uniform_triton
    from dflash2.kernels.linear import MAX_ROWS, _DEFAULT_SMS, _small_m_linear_triton, default_config
    from dflash2.kernels.norm_rope import norm_rope, norm_rope_into_cache, norm_rope_queries_and_cache
    from dflash2.kernels.row_attention import _row_attention_triton
    from dflash2.kernels.row_mean import _row_mean_triton, _num_warps, block_k_for
    from dflash2.kernels.selector import _selector_walk_triton
    from dflash2.kernels.silu_mul import silu_mul
    from dflash2.kernels.topk import _vocab_topk_triton
    from dflash2.kernels.tree_expand import _expand_triton
    from dflash2.kernels.tree_mask import _tree_mask_triton
    from dflash2.kernels.verify import _verify_block_triton

    bf16, f32, i64 = torch.bfloat16, torch.float32, torch.int64
    e = torch.empty
    out = []
    # small-M linear: (N, K) of the 8B target's q/k/v and gate/up (each as one matrix and as a
    # fused group's members, read in place), o, down and head, SmolLM2's q/k/v (both ways), down
    # and head; 1, 16 and 32 rows, and 128 rows (row groups, exact mode's verify)
    shapes = [("8b", sizes, k, bf16) for sizes, k in (((6144,), 4096), ((4096, 1024, 1024), 4096), ((4096,), 4096),
                                                     ((24576,), 4096), ((12288, 12288), 4096), ((4096,), 12288),
                                                     ((151936,), 4096))]
    shapes += [("135m", sizes, k, dt) for sizes, k in (((960,), 576), ((576, 192, 192), 576), ((576,), 1536),
                                                      ((49152,), 576)) for dt in (bf16, f32)]
    for tag, sizes, k, dt in shapes:
        n = sum(sizes)
        config = default_config(n, k, dt, _DEFAULT_SMS)
        w = tuple(e(ni, k, dtype=dt) for ni in sizes) if len(sizes) > 1 else e(n, k, dtype=dt)
        shape = "+".join(map(str, sizes)) + f"x{k}"
        for m in (1, 16, MAX_ROWS, 4 * MAX_ROWS):
            out.append((f"linear {tag} {shape} {str(dt)[6:]} M={m}",
                        lambda m=m, w=w, k=k, dt=dt, c=config: _small_m_linear_triton(e(m, k, dtype=dt), w, None, c)))
        if dt == bf16:  # programmatic dependent launch, as SmallMLinearMode(pdl=True) runs it on sm_90
            out.append((f"linear {tag} {shape} bf16 M=1 PDL", lambda w=w, k=k, c=config: _small_m_linear_triton(
                e(1, k, dtype=bf16), w, None, c), {"PDL": True}))
    # row attention: the 8B target (32/8 heads, hd 128) and SmolLM2 (9/3, hd 64) at decode and a
    # 16-token verify, batch 1 and 8; exact mode's fixed splits and query tile; the merge unrolled
    for tag, nh, nkv, hd, dt in (("8b", 32, 8, 128, bf16), ("135m", 9, 3, 64, bf16), ("135m", 9, 3, 64, f32)):
        for b, q in ((1, 1), (1, 16), (8, 8)):
            kv = 528

            def args(b=b, q=q, nh=nh, nkv=nkv, hd=hd, dt=dt, kv=kv):
                return (e(b, nh, q, hd, dtype=dt), e(b, nkv, kv, hd, dtype=dt), e(b, nkv, kv, hd, dtype=dt),
                        torch.full((b, q), kv - 1, dtype=i64), None, None)

            out.append((f"row_attention {tag} {str(dt)[6:]} B={b} q={q}", lambda a=args: _row_attention_triton(*a())))
            out.append((f"row_attention {tag} {str(dt)[6:]} B={b} q={q} exact",
                        lambda a=args: _row_attention_triton(*a(), split_keys=256, tile_queries=16)))
        out.append((f"row_attention {tag} {str(dt)[6:]} merge unrolled",
                    lambda nh=nh, nkv=nkv, hd=hd, dt=dt: _row_attention_triton(
                        e(1, nh, 16, hd, dtype=dt), e(1, nkv, 528, hd, dtype=dt), e(1, nkv, 528, hd, dtype=dt),
                        torch.full((1, 16), 527, dtype=i64), None, None, merge_unroll=True)))
    # the draft's norm-RoPE: queries (32 heads) to a fresh tensor, block keys and values into the cache
    for dt in (bf16, f32):
        out.append((f"norm_rope queries {str(dt)[6:]}", lambda dt=dt: norm_rope(
            e(1, 16, 32, 128, dtype=dt), e(128, dtype=dt), 1e-6, e(1, 16, 128, dtype=dt), e(1, 16, 128, dtype=dt),
            impl="triton")))
        out.append((f"norm_rope_into_cache {str(dt)[6:]}", lambda dt=dt: norm_rope_into_cache(
            e(8, 16, 8, 128, dtype=dt), e(8, 16, 8, 128, dtype=dt), e(128, dtype=dt), 1e-6,
            e(8, 16, 128, dtype=dt), e(8, 16, 128, dtype=dt), e(8, 8, 544, 128, dtype=dt),
            e(8, 8, 544, 128, dtype=dt), torch.zeros(8, 16, dtype=i64), impl="triton")))
        out.append((f"norm_rope_queries_and_cache {str(dt)[6:]}", lambda dt=dt: norm_rope_queries_and_cache(
            e(1, 16, 32, 128, dtype=dt), e(128, dtype=dt), 1e-6, e(1, 16, 128, dtype=dt), e(1, 16, 128, dtype=dt),
            e(1, 32, 8, 128, dtype=dt), e(1, 32, 8, 128, dtype=dt), e(128, dtype=dt), 1e-6,
            e(1, 32, 128, dtype=dt), e(1, 32, 128, dtype=dt), e(1, 8, 544, 128, dtype=dt),
            e(1, 8, 544, 128, dtype=dt), torch.zeros(1, 32, dtype=i64), impl="triton")))
    # the norms' row mean (exact mode), the vocabulary top-k, the selector walk, the verify, the conv
    for hidden, dt in ((4096, bf16), (576, bf16), (576, f32)):
        bk = block_k_for(hidden, dt)
        out.append((f"row_mean {hidden} {str(dt)[6:]}",
                    lambda h=hidden, dt=dt, bk=bk: _row_mean_triton(e(16, h, dtype=dt), bk, _num_warps(bk))))
    for vocab, dt in ((151936, bf16), (49152, f32)):
        out.append((f"vocab_topk V={vocab} {str(dt)[6:]}",
                    lambda v=vocab, dt=dt: _vocab_topk_triton(e(16, v, dtype=dt), 16, 1.0, 0.0)))
        for m in (16, 128):  # with the rows' validity flags (the draft step's call), both tilings
            out.append((f"vocab_topk V={vocab} {str(dt)[6:]} M={m} with_invalid",
                        lambda v=vocab, dt=dt, m=m: _vocab_topk_triton(e(m, v, dtype=dt), 16, 1.0, 0.0,
                                                                       with_invalid=True)))
        out.append((f"verify_block V={vocab} N=15",
                    lambda v=vocab: _verify_block_triton(
                        e(1, 16, v, dtype=f32), torch.zeros(1, 15, dtype=i64), torch.zeros(1, 15, 16, dtype=i64),
                        e(1, 15, 16, dtype=f32), torch.zeros(1), torch.zeros(1, dtype=i64), torch.zeros(1, dtype=i64))))
    for b, n in ((1, 15), (8, 7)):
        out.append((f"selector_walk B={b} N={n}", lambda b=b, n=n: _selector_walk_triton(
            e(b, n, 16, dtype=f32), torch.zeros(b, n, 16, dtype=i64), e(b, n, 256, dtype=f32),
            e(151936, 256, dtype=bf16), e(151936, 256, dtype=bf16), torch.zeros(b, dtype=i64), torch.zeros(b),
            torch.zeros(b, dtype=i64), torch.zeros(b, dtype=i64))))
    for hidden, dt in ((4096, bf16), (576, f32)):
        out.append((f"grouped_dynamic_conv H={hidden} {str(dt)[6:]}",
                    lambda h=hidden, dt=dt: _grouped_dynamic_conv_triton(
                        e(8, 16, h, dtype=dt), e(2, 2, h, dtype=dt), e(8, 16, 2 * 2 * (h // 16), dtype=dt), 0, 16, 16)))
    out.append(("grouped_dynamic_conv finish + residual H=4096 bfloat16", lambda: _grouped_dynamic_conv_triton(
        e(8, 16, 4096, dtype=bf16), e(2, 2, 4096, dtype=bf16), e(8, 16, 2 * 2 * 256, dtype=bf16), 1, 16, 16,
        residual=e(8, 16, 4096, dtype=bf16))))
    # the finish side + residual + the next RMSNorm: one chunk per row (H 4096, 576), and chunked
    for b, hidden, dt, bh in ((1, 4096, bf16, None), (8, 4096, bf16, None), (8, 4096, bf16, 1024), (8, 576, f32, None)):
        out.append((f"grouped_dynamic_conv_norm B={b} H={hidden} {str(dt)[6:]}" + (f" chunk {bh}" if bh else ""),
                    lambda b=b, h=hidden, dt=dt, bh=bh: _grouped_dynamic_conv_norm_triton(
                        e(b, 16, h, dtype=dt), e(2, 2, h, dtype=dt), e(b, 16, 2 * 2 * (h // 16), dtype=dt), 1, 16, 16,
                        e(b, 16, h, dtype=dt), e(h, dtype=dt), 1e-6, block_h=bh)))
    # the draft MLP's SwiGLU product, gate and up as column slices of the fused gate/up output
    for rows, inter, dt in ((16, 12288, bf16), (64, 1536, f32)):
        out.append((f"silu_mul rows={rows} I={inter} {str(dt)[6:]}", lambda r=rows, i=inter, dt=dt: silu_mul(
            *e(r, 2 * i, dtype=dt).split(i, dim=1), impl="triton")))
    # the fused head loss's row kernel (training): a chunk of the 0.5B ablation's logits, V = 151936
    for rows, dt in ((7680, bf16), (64, f32)):
        out.append((f"head_ce rows={rows} V=151936 {str(dt)[6:]}", lambda r=rows, dt=dt: _head_ce_triton(
            e(r, 151936, dtype=dt), torch.zeros(r, dtype=i64), e(r, dtype=f32), 128)))
    # the tree verify's attention mask: 64 nodes over a 4096-slot cache, batch 8
    out.append(("tree_mask B=8 nodes=64 kv=4096", lambda: _tree_mask_triton(
        torch.full((8, 64), -1, dtype=i64), torch.zeros(8, dtype=i64), 4096)))
    # the tree's best-first expansion: N = 15 slots of top-16 candidates, 32 and 64 nodes, batch 128
    for nodes in (32, 64):
        out.append((f"tree_expand B=128 nodes={nodes} N=15 k=16", lambda nodes=nodes: _expand_triton(
            e(128, 15, 16, 16, dtype=f32), e(128, 15, 16, dtype=i64), e(128, dtype=i64), nodes, e(128, 15, dtype=i64))))
    out.append(("keyed_uniform", lambda: keyed_uniform_triton(torch.zeros(8, dtype=i64), 1, torch.zeros(8, dtype=i64),
                                                             torch.arange(8))))
    return out


def selftest_cases():
    """Two launches the check must reject: a kernel that does not compile (a dot of mismatched
    inner dimensions) and one whose shared memory exceeds the H200's (bf16 operand tiles of
    128 x 512 and 512 x 128, 256 KiB), each as a case of `cases()`'s form."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _broken_dot_kernel(a_ptr, out_ptr, B: tl.constexpr):
        i = tl.arange(0, B)
        a = tl.load(a_ptr + i[:, None] * B + i[None, :])
        b = tl.load(a_ptr + i[:, None] * (2 * B) + tl.arange(0, 2 * B)[None, :])
        tl.store(out_ptr + i[:, None] * B + i[None, :], tl.dot(tl.trans(b), a))  # [2B, B] x [B, B] -> wrong shape

    @triton.jit
    def _huge_tiles_kernel(a_ptr, b_ptr, out_ptr, K, M: tl.constexpr, N: tl.constexpr, BK: tl.constexpr):
        m, n, kk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, BK)
        acc = tl.zeros([M, N], dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + m[:, None] * K + (k0 + kk)[None, :])
            b = tl.load(b_ptr + (k0 + kk)[:, None] * N + n[None, :])
            acc += tl.dot(a, b)
        tl.store(out_ptr + m[:, None] * N + n[None, :], acc)

    e = torch.empty
    return [("selftest: a dot that does not compile", lambda: _broken_dot_kernel[(1,)](e(64, 64), e(32, 32), B=32)),
            ("selftest: shared memory past the H200's", lambda: _huge_tiles_kernel[(1,)](
                e(128, 4096, dtype=torch.bfloat16), e(4096, 128, dtype=torch.bfloat16), e(128, 128), 4096, M=128,
                N=128, BK=512))]


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("error: run without TRITON_INTERPRET (the interpreter replaces the JIT functions)", file=sys.stderr)
        return 2
    import torch

    failures = 0
    with torch.no_grad():
        for label, call, *overrides in (selftest_cases() if "--selftest" in argv else cases()):
            for fn, args, kwargs in capture(call):
                t0 = time.perf_counter()
                row = {"case": label, "kernel": fn.fn.__name__}
                try:
                    name, shown, meta, ptx = compile_launch(fn, args, dict(kwargs), *overrides)
                    row.update(ok=meta.shared <= H200_SHARED_BYTES, shared_bytes=meta.shared,
                               num_warps=meta.num_warps, num_stages=meta.num_stages, constexprs=shown,
                               async_copies=ptx.count("cp.async.cg.shared.global"))
                    if not row["ok"]:
                        row["error"] = f"static shared memory {meta.shared} B > the H200's {H200_SHARED_BYTES} B"
                except Exception as exc:  # noqa: BLE001  (each launch reports its own failure)
                    row.update(ok=False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
                row["seconds"] = round(time.perf_counter() - t0, 2)
                failures += not row["ok"]
                print(json.dumps(row), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
