"""Benchmark the fused DFlash2 kernels against their torch references at Qwen3-8B shapes.

    python -m benchmarks.kernels [--out table.md] [--batches 1 8 32] [--sweep]

Per kernel and batch: the Triton time (median of CUDA-graph replays, so launch overhead is
the GPU's, not Python's), the bytes it must move, GB/s and % of the measured HBM roofline (a
device-to-device copy timed in the same run), and the speedup over the torch reference run
eagerly and captured in a CUDA graph. Inputs rotate over several buffers (> L2 in total where
memory allows) so repeated calls do not time the cache. Shapes: H 4096, V 151936, query block
16 (N = 15 drafts), k 16 candidates, rank 256, conv K 2, g 16, bf16 activations/weights,
fp32 target logits; row attention at Qwen3-8B heads (32 / 8, hd 128) over a 512-token context
with 1, 4 and 16 queries per row (the reference is SDPA with the per-row mask, the engine's
default); the draft's norm-RoPE of a block's 16 keys and values into its cache (the reference:
RMSNorm, RoPE and two scatters); the conv's finish side with the layer's residual add in one
launch (the reference: the conv's launch, then PyTorch's add); the same followed by the next
sublayer's RMSNorm in one launch (the reference: the conv + residual launch, then the norm's
PyTorch ops). ``--sweep`` also times alternative tilings (used to pick the defaults).

Training (``--part training``, or with everything by default): ``head_ce``, the fused head loss's
row kernel, over one chunk of the Qwen2.5-Coder-0.5B ablation (64 anchors x 8 sequences x 15
slots = 7680 rows of V = 151936 bf16 logits), against the ops it replaces: the torch reference
eagerly, and the trainer's former pair (the group maxima, then ``ce_and_logits_grad`` compiled).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Callable, Collection

import torch

from dflash2.kernels.dynamic_conv import (_grouped_dynamic_conv_norm_triton, _grouped_dynamic_conv_triton,
                                          grouped_dynamic_conv, rms_norm_reference)
from dflash2.kernels.row_attention import _row_attention_triton, row_attention
from dflash2.kernels.selector import selector_walk
from dflash2.kernels.tree_expand import expand_nodes
from dflash2.kernels.tree_mask import tree_attention_mask
from dflash2.kernels.topk import _vocab_topk_triton, vocab_topk
from dflash2.kernels.verify import _verify_block_triton, verify_block

H, V, Q, K_CAND, RANK, TAPS, GROUP = 4096, 151936, 16, 16, 256, 2, 16
N = Q - 1
CONV_PER_STEP = 20  # 5 layers x 2 sublayers x (prepare + finish)
ROTATE_BYTES = 256 << 20  # rotate inputs over at least this many bytes (L2 is 60 MB on H200)


def _time_graph_us(fns: list[Callable[[], object]], reps: int) -> float:
    """Median time of one call, from replays of a CUDA graph holding ``reps`` calls."""
    import triton

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, allocator) outside the capture
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fns[i % len(fns)]()
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
    del graph
    return ms * 1e3 / reps


def _time_eager_us(fns: list[Callable[[], object]]) -> float:
    import triton

    it = itertools.cycle(fns)
    for fn in fns:
        fn()
    return triton.testing.do_bench(lambda: next(it)(), warmup=25, rep=200, return_mode="median") * 1e3


def _copy_bandwidth() -> float:
    """HBM roofline in GB/s: a 1 GiB device-to-device copy, bytes read + written."""
    import triton

    src = torch.randn(1 << 28, device="cuda")  # 1 GiB fp32, random (not zeros)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


def _n_sets(bytes_per_call: int, cap: int) -> int:
    return max(1, min(cap, math.ceil(ROTATE_BYTES / max(bytes_per_call, 1))))


# Problem builders: each returns (triton_fns, torch_fns, bytes_per_call, shape_str).
def _conv_inputs(batch: int, with_residual: bool = False):
    """CONV_PER_STEP rotating (z, proj[, residual]) sets and one base kernel, bf16 on CUDA, and
    the bytes one application moves."""
    dev, dt = "cuda", torch.bfloat16
    g_count = H // GROUP
    sets = [
        (torch.randn(batch, Q, H, device=dev, dtype=dt),
         torch.randn(batch, Q, 2 * TAPS * g_count, device=dev, dtype=dt))
        + ((torch.randn(batch, Q, H, device=dev, dtype=dt),) if with_residual else ())
        for _ in range(CONV_PER_STEP)
    ]
    base = torch.randn(2, TAPS, H, device=dev, dtype=dt)
    activations = (3 if with_residual else 2) * batch * Q * H  # z, out[, residual]
    return sets, base, 2 * (activations + batch * Q * TAPS * g_count + TAPS * H)


def conv_case(batch: int, tiling: tuple[int, int, int] | None = None):
    sets, base, nbytes = _conv_inputs(batch)
    kw = {} if tiling is None else dict(zip(("block_t", "block_h", "num_warps"), tiling))
    tri = [(lambda z=z, p=p: _grouped_dynamic_conv_triton(z, base, p, 1, Q, GROUP, **kw)) for z, p in sets]
    ref = [(lambda z=z, p=p: grouped_dynamic_conv(z, base, p, 1, Q, GROUP, "torch")) for z, p in sets]
    return tri, ref, nbytes, f"z[{batch},{Q},{H}] K{TAPS} g{GROUP}"


def conv_residual_case(batch: int):
    """The finish side with the layer's residual add in its epilogue (one launch), against the
    two launches it replaces (the Triton conv, then PyTorch's add) as the reference column."""
    sets, base, nbytes = _conv_inputs(batch, with_residual=True)
    tri = [(lambda z=z, p=p, r=r: _grouped_dynamic_conv_triton(z, base, p, 1, Q, GROUP, residual=r))
           for z, p, r in sets]
    two = [(lambda z=z, p=p, r=r: r + _grouped_dynamic_conv_triton(z, base, p, 1, Q, GROUP)) for z, p, r in sets]
    return tri, two, nbytes, f"z[{batch},{Q},{H}] K{TAPS} g{GROUP} + residual"


def conv_norm_case(batch: int, tiling: tuple[int, int] | None = None):
    """The finish side with the residual add and the next sublayer's RMSNorm in one launch,
    against the two launches it replaces (the conv with its residual, then Qwen3RMSNorm's PyTorch
    ops, themselves several kernels) as the reference column. `tiling`: (block_h, num_warps)."""
    sets, base, nbytes = _conv_inputs(batch, with_residual=True)
    weight = (1 + 0.1 * torch.randn(H, device="cuda")).to(torch.bfloat16)
    kw = {} if tiling is None else dict(zip(("block_h", "num_warps"), tiling))
    tri = [(lambda z=z, p=p, r=r: _grouped_dynamic_conv_norm_triton(z, base, p, 1, Q, GROUP, r, weight, 1e-6, **kw))
           for z, p, r in sets]
    two = [(lambda z=z, p=p, r=r: rms_norm_reference(_grouped_dynamic_conv_triton(z, base, p, 1, Q, GROUP, residual=r),
                                                     weight, 1e-6)) for z, p, r in sets]
    nbytes += batch * Q * H * 2 + H * 2  # normed written, the weight read
    return tri, two, nbytes, f"z[{batch},{Q},{H}] K{TAPS} g{GROUP} + residual + RMSNorm"


def topk_case(batch: int, config: dict | None = None):
    rows = Q * batch
    nbytes = rows * V * 2
    sets = [torch.randn(rows, V, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(_n_sets(nbytes, 32))]
    tri = [(lambda x=x: _vocab_topk_triton(x, K_CAND, 1.0, 0.0, config)) for x in sets]
    ref = [(lambda x=x: vocab_topk(x, K_CAND, impl="torch")) for x in sets]
    base = [(lambda x=x: torch.topk(x, K_CAND, dim=-1)) for x in sets]
    return tri, ref, base, nbytes, f"[{rows},{V}] bf16 k{K_CAND}"


def head_ce_case(rows: int = 7680, vocab: int = V):
    """`head_ce` on `[rows, vocab]` bf16 logits: it reads them twice and writes the gradient once
    (the bytes counted); the reference and the trainer's former pair (group maxima by `amax`, then
    the compiled `ce_and_logits_grad`) as the baselines."""
    from dflash2.kernels.head_ce import head_ce
    from dflash2.training.losses import TOPK_GROUP, ce_and_logits_grad

    z = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 3
    y = torch.randint(0, vocab, (rows,), device="cuda")
    coef = torch.rand(rows, device="cuda")
    nbytes = 3 * rows * vocab * 2
    compiled = torch.compile(ce_and_logits_grad, dynamic=False)
    tri = [lambda: head_ce(z, y, coef, group=TOPK_GROUP, impl="triton")]
    ref = [lambda: head_ce(z, y, coef, group=TOPK_GROUP, impl="torch")]
    pair = [lambda: (z.view(rows, -1, TOPK_GROUP).amax(-1), compiled(z, y, coef))]
    return tri, ref, pair, nbytes, f"[{rows},{vocab}] bf16"


def topk_invalid_case(batch: int):
    """The top-k with the rows' validity flags from its own two launches, against the draft
    step's former pair: the Triton top-k, then `invalid_rows` over the logits (its own launches
    and read of them) as the reference column."""
    from dflash2.engine.sampling import invalid_rows

    rows = Q * batch
    nbytes = rows * V * 2
    sets = [torch.randn(rows, V, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(_n_sets(nbytes, 32))]
    tri = [(lambda x=x: _vocab_topk_triton(x, K_CAND, 1.0, 0.0, with_invalid=True)) for x in sets]
    two = [(lambda x=x: (_vocab_topk_triton(x, K_CAND, 1.0, 0.0), invalid_rows(x.view(batch, Q, V)))) for x in sets]
    return tri, two, nbytes, f"[{rows},{V}] bf16 k{K_CAND} + invalid"


def walk_case(batch: int):
    dev = "cuda"
    a = torch.randn(V, RANK, device=dev, dtype=torch.bfloat16)
    z = torch.randn(V, RANK, device=dev, dtype=torch.bfloat16)
    unary = torch.randn(batch, N, K_CAND, device=dev)
    cand = torch.randint(0, V, (batch, N, K_CAND), device=dev)
    eta = torch.randn(batch, N, RANK, device=dev, dtype=torch.bfloat16)
    anchor = torch.randint(0, V, (batch,), device=dev)
    temp = torch.full((batch,), 0.8, device=dev)
    seeds = torch.arange(batch, device=dev) + 11
    pos = torch.full((batch,), 1000, device=dev)
    args = (unary, cand, eta, a, z, anchor, temp, seeds, pos)
    tri = [lambda: selector_walk(*args, impl="triton")]
    ref = [lambda: selector_walk(*args, impl="torch")]
    nbytes = batch * N * (2 * K_CAND * RANK * 2 + RANK * 2 + K_CAND * (4 + 8 + 4) + 16)
    return tri, ref, nbytes, f"B{batch} N{N} k{K_CAND} R{RANK} V{V} T>0"


def verify_case(batch: int, sampled: bool, block: int | None = None, num_warps: int | None = None):
    dev = "cuda"
    nbytes = batch * Q * V * 4
    sets = []
    for _ in range(_n_sets(nbytes, 16)):
        logits = torch.randn(batch, Q, V, device=dev) * 3
        draft = logits[:, :N].argmax(-1)
        draft[:, N // 2 :] = 7  # reject about half-way
        cand = torch.randint(0, V, (batch, N, K_CAND), device=dev)
        cand[..., 0] = draft
        q = torch.softmax(torch.randn(batch, N, K_CAND, device=dev), -1)
        temp = torch.full((batch,), 1.0 if sampled else 0.0, device=dev)
        seeds = torch.arange(batch, device=dev) * 3 + 1
        pos = torch.full((batch,), 500, device=dev)
        sets.append((logits, draft, cand, q, temp, seeds, pos))
    kw = {} if block is None else {"block": block, "num_warps": num_warps}
    tri = [(lambda s=s: _verify_block_triton(*s, **kw)) for s in sets]
    ref = [(lambda s=s: verify_block(*s, impl="torch")) for s in sets]
    return tri, ref, nbytes, f"[{batch},{Q},{V}] fp32 {'T=1' if sampled else 'T=0'}"


def attention_case(batch: int, queries: int, context: int = 512, tiling: dict | None = None):
    """One target layer's attention: Qwen3-8B heads (32 query / 8 K/V, hd 128), `queries` per row
    (1 = AR decode, 16 = a verify block), a static cache of `context` + one block of slots.
    `tiling`: keyword knobs of the Triton path (`splits`, `block_n`, `num_warps`, `merge_block`,
    `merge_unroll`; sweeps only)."""
    dev, heads, kv_heads, hd = "cuda", 32, 8, 128
    slots = context + Q
    nbytes = 2 * batch * kv_heads * (context + queries) * hd * 2  # K and V read once
    sets = []
    for _ in range(_n_sets(nbytes, 16)):
        q = torch.randn(batch, queries, heads, hd, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(batch, kv_heads, slots, hd, device=dev, dtype=torch.bfloat16)
        v = torch.randn(batch, kv_heads, slots, hd, device=dev, dtype=torch.bfloat16)
        pos = (torch.full((batch, 1), context, device=dev) + torch.arange(queries, device=dev)).long()
        sets.append((q, k, v, pos))
    if tiling:
        tri = [(lambda s=s: _row_attention_triton(*s, None, None, **tiling)) for s in sets]
    else:
        tri = [(lambda s=s: row_attention(*s, impl="triton")) for s in sets]
    ref = [(lambda s=s: row_attention(*s, impl="torch")) for s in sets]
    return tri, ref, nbytes, f"B{batch} q{queries} 32/8 heads hd128 kv{slots} bf16"


def norm_rope_case(batch: int, tokens: int = Q, cache_len: int = 512 + Q):
    """One draft layer's norm-RoPE into its cache: the block's `tokens` keys and values (8 K/V
    heads, hd 128) written at their slots, as `DraftAttention.write_kv` does; the reference is the
    module's ops (RMSNorm, RoPE, two scatters)."""
    from dflash2.kernels.norm_rope import norm_rope_into_cache

    dev, kv_heads, hd = "cuda", 8, 128
    nbytes = 2 * 2 * batch * tokens * kv_heads * hd * 2 + 2 * batch * tokens * hd * 2  # k, v in and out; cos, sin
    sets = []
    for _ in range(_n_sets(nbytes, 16)):
        k = torch.randn(batch, tokens, kv_heads, hd, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        w = torch.ones(hd, device=dev, dtype=torch.bfloat16)
        ang = torch.rand(batch, tokens, hd, device=dev) * 6.28
        cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
        caches = [torch.zeros(batch, kv_heads, cache_len, hd, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        slots = (512 + torch.arange(tokens, device=dev))[None].expand(batch, -1).contiguous()
        sets.append((k, v, w, 1e-6, cos, sin, *caches, slots))
    tri = [(lambda s=s: norm_rope_into_cache(*s, impl="triton")) for s in sets]
    ref = [(lambda s=s: norm_rope_into_cache(*s, impl="torch")) for s in sets]
    return tri, ref, nbytes, f"[{batch},{tokens},8,128] -> cache bf16"


def step_fns(batch: int, impl: str):
    """All DFlash2-specific work of one step: 20 conv applications, top-K, walk, verify."""
    conv_tri, conv_ref, _, _ = conv_case(batch)
    tk = torch.randn(Q * batch, V, device="cuda", dtype=torch.bfloat16)
    walk_tri, walk_ref, _, _ = walk_case(batch)
    ver_tri, ver_ref, _, _ = verify_case(batch, sampled=True)
    convs = conv_tri if impl == "triton" else conv_ref

    def step():
        for fn in convs:
            fn()
        vocab_topk(tk, K_CAND, impl=impl)
        (walk_tri if impl == "triton" else walk_ref)[0]()
        (ver_tri if impl == "triton" else ver_ref)[0]()

    return step


class Table:
    def __init__(self, header: list[str]):
        self.rows = [header, ["---"] * len(header)]

    def add(self, *cells) -> None:
        self.rows.append([c if isinstance(c, str) else f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells])
        print("| " + " | ".join(self.rows[-1]) + " |", flush=True)

    def markdown(self) -> str:
        return "\n".join("| " + " | ".join(r) + " |" for r in self.rows)


def tree_mask_case(batch: int, nodes: int = 64, context: int = 4096):
    """The tree verify's attention mask: `nodes` nodes (a binary-ish tree: node i under (i-1)//2)
    over `context` committed slots plus the tree's own."""
    dev = "cuda"
    idx = torch.arange(nodes, device=dev)
    parent = torch.where(idx > 0, (idx - 1) // 2, -1).expand(batch, nodes).contiguous()
    ctx = torch.full((batch,), context, device=dev)
    kv = context + nodes
    tri = [lambda: tree_attention_mask(parent, ctx, kv, impl="triton")]
    ref = [lambda: tree_attention_mask(parent, ctx, kv, impl="torch")]
    return tri, ref, batch * nodes * kv, f"B{batch} nodes{nodes} kv{kv} (bool out)"


def tree_expand_case(batch: int, nodes: int = 32, n: int = 15, k: int = 16):
    """The tree verify's best-first expansion (`dflash2.kernels.tree_expand`): `nodes` nodes from
    N = `n` slots of top-`k` candidates (the 0.5B study's tree32 at N = 15, selector top-16)."""
    dev = "cuda"
    logp = torch.log_softmax(torch.randn(batch, n, k, k, device=dev), -1)
    cand = torch.randint(0, 151936, (batch, n, k), device=dev)
    anchor = torch.randint(0, 151936, (batch,), device=dev)
    chain = torch.zeros(batch, n, dtype=torch.long, device=dev)
    tri = [lambda: expand_nodes(logp, cand, anchor, nodes, chain, impl="triton")]
    ref = [lambda: expand_nodes(logp, cand, anchor, nodes, chain, impl="torch")]
    return tri, ref, logp.numel() * 4 + cand.numel() * 8, f"B{batch} nodes{nodes} N{n} k{k}"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="also write the markdown tables here")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--sweep", action="store_true", help="also time alternative tilings")
    parser.add_argument("--part", choices=["all", "inference", "training"], default="all",
                        help="the inference kernels (8B shapes), the training kernel, or both")
    parser.add_argument("--sweep-kernels", nargs="+", default=list(SWEPT),
                        choices=list(SWEPT), help="the kernels --sweep covers (default: all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.kernels needs a CUDA device")
    import triton

    torch.manual_seed(0)
    bw = _copy_bandwidth()
    head = (
        f"GPU {torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
        f"HBM roofline (1 GiB D2D copy, read+write) {bw:.0f} GB/s"
    )
    print(head, flush=True)
    out = [f"### Kernel benchmark\n\n{head}\n"]
    tab = Table(["kernel", "batch", "shape", "MB moved", "triton us", "GB/s", "% roofline",
                 "ref eager us", "ref graph us", "x eager", "x graph"])

    def row(name, batch, shape, nbytes, tri, ref, reps=20):
        t = _time_graph_us(tri, max(reps, len(tri)))
        re = _time_eager_us(ref)
        rg = _time_graph_us(ref, max(reps, len(ref)))
        gbs = nbytes / (t * 1e-6) / 1e9
        tab.add(name, batch, shape, nbytes / 1e6, t, gbs, 100 * gbs / bw, re, rg, re / t, rg / t)
        return t

    step_rows = []
    for batch in (args.batches if args.part != "training" else []):
        tri, ref, nbytes, shape = conv_case(batch)
        row("dynamic_conv (1 application)", batch, shape, nbytes, tri, ref)
        tri, two, nbytes, shape = conv_residual_case(batch)
        row("dynamic_conv finish + residual (ref: conv, then add)", batch, shape, nbytes, tri, two)
        tri, two, nbytes, shape = conv_norm_case(batch)
        row("dynamic_conv finish + residual + RMSNorm (ref: conv + residual, then the norm)", batch, shape, nbytes,
            tri, two)
        tri, ref, base, nbytes, shape = topk_case(batch)
        t = row("vocab_topk", batch, shape, nbytes, tri, ref)
        be, bg = _time_eager_us(base), _time_graph_us(base, max(20, len(base)))
        tab.add("  torch.topk baseline (bf16)", batch, shape, nbytes / 1e6, t, nbytes / (t * 1e-6) / 1e9,
                100 * nbytes / (t * 1e-6) / 1e9 / bw, be, bg, be / t, bg / t)
        tri, two, nbytes, shape = topk_invalid_case(batch)
        row("vocab_topk with_invalid (ref: vocab_topk, then invalid_rows)", batch, shape, nbytes, tri, two)
        tri, ref, nbytes, shape = walk_case(batch)
        row("selector_walk", batch, shape, nbytes, tri, ref, reps=10)
        tri, ref, nbytes, shape = tree_mask_case(batch)
        row("tree_attention_mask", batch, shape, nbytes, tri, ref, reps=10)
        tri, ref, nbytes, shape = tree_expand_case(batch)
        row("tree_expand (ref: ~40 launches per node)", batch, shape, nbytes, tri, ref, reps=10)
        for sampled in (False, True):
            tri, ref, nbytes, shape = verify_case(batch, sampled)
            row("verify_block", batch, shape, nbytes, tri, ref, reps=10)
        for queries in (1, 4, 16):
            tri, ref, nbytes, shape = attention_case(batch, queries)
            row("row_attention (1 layer)", batch, shape, nbytes, tri, ref)
        tri, ref, nbytes, shape = norm_rope_case(batch)
        row("norm_rope_into_cache (1 layer's block)", batch, shape, nbytes, tri, ref)
        st = _time_graph_us([step_fns(batch, "triton")], 3)
        sr = _time_graph_us([step_fns(batch, "torch")], 3)
        step_rows.append((batch, st, sr))
        torch.cuda.empty_cache()
    if args.part != "inference":
        tri, ref, pair, nbytes, shape = head_ce_case()
        t = row("head_ce (training; ref: the torch reference)", "-", shape, nbytes, tri, ref, reps=5)
        pe, pg = _time_eager_us(pair), _time_graph_us(pair, 5)
        tab.add("  former pair: amax, then ce_and_logits_grad compiled", "-", shape, nbytes / 1e6, t,
                nbytes / (t * 1e-6) / 1e9, 100 * nbytes / (t * 1e-6) / 1e9 / bw, pe, pg, pe / t, pg / t)
        torch.cuda.empty_cache()
    out.append(tab.markdown())
    if args.part == "training":
        return _written(out, args.out)

    steps = Table(["batch", "DFlash2 step work, triton us (graph)", "torch reference us (graph)", "speedup"])
    print("\nOne step of DFlash2-specific work (20 conv + top-K [16B, V] + walk + verify T=1):")
    for batch, st, sr in step_rows:
        steps.add(batch, st, sr, sr / st)
    out.append("\nOne step of DFlash2-specific work (20 conv applications + top-16 over [16B, V] + walk + "
               "verify at T=1), CUDA graph:\n\n" + steps.markdown())

    try:
        import flashinfer  # noqa: F401

        out.append("\nflashinfer is importable but not wired in (its tie order is not our contract).")
    except ImportError:
        out.append("\nflashinfer: not installed (FlashInfer top-k not timed).")

    if args.sweep:
        out.append(_sweeps(args.batches, bw, set(args.sweep_kernels)))
    return _written(out, args.out)


def _written(parts: list[str], path: str | None) -> str:
    """The report's text from its parts, also written to `path` when given."""
    text = "\n".join(parts) + "\n"
    if path:
        with open(path, "w") as f:
            f.write(text)
    return text


SWEPT = ("vocab_topk", "verify_block", "row_attention", "dynamic_conv")


def _sweeps(batches: list[int], bw: float, kernels: Collection[str] = SWEPT) -> str:
    parts = ["\n#### Tiling sweeps (triton us, CUDA graph)\n"]
    tab = Table(["kernel", "batch", "config", "us", "% roofline"])

    def timed(name: str, batch: int, config: str, fns, nbytes: int, reps: int) -> None:
        t = _time_graph_us(fns, reps)
        tab.add(name, batch, config, t, 100 * nbytes / (t * 1e-6) / 1e9 / bw)

    for batch in batches:
        if "vocab_topk" in kernels:
            for groups, warps, merge_warps in ((256, 2, 4), (256, 1, 4), (512, 1, 4), (512, 2, 4), (256, 2, 1),
                                               (128, 1, 1)):
                cfg = {"groups": groups, "num_warps": warps, "merge_warps": merge_warps}
                tri, _, _, nbytes, _ = topk_case(batch, cfg)
                timed("vocab_topk", batch, f"groups {groups} warps {warps} merge warps {merge_warps}", tri, nbytes,
                      max(20, len(tri)))
        if "verify_block" in kernels:
            for sampled in (False, True):
                for block, warps in ((2048, 4), (4096, 8), (8192, 8)):
                    tri, _, nbytes, _ = verify_case(batch, sampled, block, warps)
                    timed("verify_block", batch, f"T={int(sampled)} block {block} warps {warps}", tri, nbytes,
                          max(10, len(tri)))
        if "row_attention" in kernels:
            for queries in (1, 8, 16):  # AR, a verify of N = 7 and of N = 15 (and the draft's block)
                for block_n, warps, splits in ((64, 4, None), (128, 8, None), (64, 4, 1), (64, 4, 2), (64, 4, 3),
                                               (64, 4, 4), (64, 4, 6), (64, 4, 8), (128, 8, 2), (128, 8, 3),
                                               (128, 4, 2)):
                    tiling = {"block_n": block_n, "num_warps": warps, "splits": splits}
                    tri, _, nbytes, _ = attention_case(batch, queries, tiling=tiling)
                    timed("row_attention", batch, f"q{queries} block_n {block_n} warps {warps} splits "
                          f"{splits or 'auto'}", tri, nbytes, max(20, len(tri)))
                for merge in ((64, 128), (16, 64), (16, 32), (8, 64)):  # (64, 128): one merge program per (row, head)
                    for unroll in (False, True):
                        tiling = {"merge_block": merge, "merge_unroll": unroll}
                        tri, _, nbytes, _ = attention_case(batch, queries, tiling=tiling)
                        timed("row_attention", batch, f"q{queries} merge block {merge[0]} rows x {merge[1]} dims"
                              f"{', unrolled' if unroll else ''}", tri, nbytes, max(20, len(tri)))
        if "dynamic_conv" in kernels:
            for tiling in ((16, 64, 4), (16, 64, 2), (8, 128, 4), (4, 256, 4), (2, 512, 4), (16, 256, 8)):
                tri, _, nbytes, _ = conv_case(batch, tiling)
                timed("dynamic_conv", batch, "block_t {} block_h {} warps {}".format(*tiling), tri, nbytes, 20)
            for tiling in ((4096, 8), (4096, 16), (4096, 4), (2048, 8), (1024, 4)):
                tri, _, nbytes, _ = conv_norm_case(batch, tiling)
                timed("dynamic_conv + RMSNorm", batch, "block_h {} warps {}".format(*tiling), tri, nbytes, 20)
        torch.cuda.empty_cache()
    parts.append(tab.markdown())
    return "\n".join(parts)


if __name__ == "__main__":
    main()
