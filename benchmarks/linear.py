"""Benchmark the small-M linear kernel against `F.linear` (cuBLAS) at Qwen3-8B linear shapes.

    python -m benchmarks.linear [--quick] [--sweep] [--rows 1 2 4 8 16 32] [--shapes k_v q_o] [--wide-rows 64 128]
                                [--out linear.json]

Per shape (q/o 4096x4096, k/v 1024x4096, gate/up 12288x4096, down 4096x12288, lm_head
151936x4096; `[N, K]`, bf16) and rows M: the median time of one call from replays of a CUDA
graph holding many calls (the device machine's host launches kernels slowly, graphs take it out),
over rotating weight copies (> L2 in total, so no call reads a cached weight), the bytes the call
must move, GB/s, % of the copy bandwidth measured in the same run (a large device-to-device copy,
bytes read + written over its time), and the speedup over cuBLAS. Then the whole linear stack of
the 8B target (36 layers x q, k, v, o, gate, up, down, plus the lm_head; 15.1 GB of distinct
weights) captured as one graph per M, the figure issue 21 item 3 asks for, each linear alone,
with q/k/v as one launch, and with q/k/v and gate/up as one launch each (the engine's layout,
every launch reading the members' weights in place); and the same stack
at `--wide-rows` rows (past one row tile: verify blocks at batch 8, exact mode), with the row
groups against a weight read per 32 rows and cuBLAS. Each kernel result is
checked against `F.linear` (max |difference| / max |reference| in the JSON).

`--sweep` times a grid of tilings (`--block-n`, `--block-k`, `--warps`, `--stages`, `--splits`)
per shape and prints the best per shape by mean % of copy bandwidth over the rows, as the
`configs` argument of `SmallMLinearMode` (also in the JSON, under `best_configs`). `--quick`
times rows 1, 8 and 32 with fewer replays (under 2 minutes on an H200). Markdown tables go to
stdout, everything to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from dflash2.kernels.linear import (MAX_ROWS, FusedLinears, LinearConfig, SmallMLinearMode, default_config,
                                    small_m_linear, ticket_buffer)

HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTER, VOCAB, LAYERS = 4096, 128, 32, 8, 12288, 151936, 36
# (name, N, K, calls per layer); the lm_head runs once per step, i.e. 1 / LAYERS per layer.
SHAPES = (
    ("q_o", HEADS * HEAD_DIM, HIDDEN, 2),
    ("k_v", KV_HEADS * HEAD_DIM, HIDDEN, 2),
    ("gate_up", INTER, HIDDEN, 2),
    ("down", HIDDEN, INTER, 1),
    ("lm_head", VOCAB, HIDDEN, 0),
)
LAYER_LINEARS = (("q", HEADS * HEAD_DIM, HIDDEN), ("k", KV_HEADS * HEAD_DIM, HIDDEN),
                 ("v", KV_HEADS * HEAD_DIM, HIDDEN), ("o", HIDDEN, HEADS * HEAD_DIM),
                 ("gate", INTER, HIDDEN), ("up", INTER, HIDDEN), ("down", HIDDEN, INTER))
ROWS = (1, 2, 4, 8, 16, 32)
QUICK_ROWS = (1, 8, 32)
WIDE_ROWS = (64, 128)  # verify blocks of batch 8 at N = 7 and 15 (exact mode routes every row count)
ROTATE_BYTES = 512 << 20  # weights rotated per timed graph (L2 is 60 MB on an H200)
CALLS_PER_GRAPH_BYTES = 4 << 30  # weight bytes a timed graph reads in all (many ms per replay)


def linear_bytes(m: int, n: int, k: int, elt: int = 2, bias: bool = False) -> int:
    """Bytes one `[m, k] x [n, k]^T` linear must move: the weight, the input, the output, the bias."""
    return elt * (n * k + m * k + m * n + (n if bias else 0))


def stack_bytes(m: int, elt: int = 2) -> int:
    """Bytes of one decode step's linears of the 8B target at `m` rows: LAYERS layers + lm_head."""
    per_layer = sum(linear_bytes(m, n, k, elt) for _, n, k in LAYER_LINEARS)
    return LAYERS * per_layer + linear_bytes(m, VOCAB, HIDDEN, elt)


def copies_for(weight_bytes: int, rotate_bytes: int = ROTATE_BYTES) -> int:
    """Distinct weight copies so that one pass over them exceeds `rotate_bytes` (at least 1)."""
    return max(1, -(-rotate_bytes // weight_bytes))


def calls_for(weight_bytes: int, copies: int, budget: int = CALLS_PER_GRAPH_BYTES) -> int:
    """Calls captured per timed graph: a whole number of passes over the copies, about `budget`
    weight bytes in all, at least one pass."""
    passes = max(1, budget // (weight_bytes * copies))
    return passes * copies


def sweep_grid(block_n, block_k, warps, stages, splits, k: int, pdl=(False,)) -> list[LinearConfig]:
    """Every tiling of the grid that makes sense for `K = k`: no split shorter than two `block_k`
    steps (it would only add partials)."""
    out = []
    for bn, bk, w, st, s, p in itertools.product(block_n, block_k, warps, stages, splits, pdl):
        if s == 1 or k // s >= 2 * bk:
            out.append(LinearConfig(block_n=bn, block_k=bk, split_k=s, num_warps=w, num_stages=st, pdl=bool(p)))
    return out


def best_config(results: list[dict]) -> dict:
    """The sweep row with the highest mean `pct_copy` over its rows (one tiling serves every M:
    the kernel's row invariance needs that)."""
    return max(results, key=lambda r: statistics.fmean(r["pct_copy"].values()))


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    """A GitHub Markdown table; floats with 1 decimal place (3 below 10)."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def time_graph_us(fn: Callable[[int], object], calls: int, replays: int) -> float:
    """Median time of one call `fn(i)`, from `replays` timed replays of a CUDA graph holding
    `fn(0) .. fn(calls - 1)` (warmed up eagerly first: compile, allocator)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(0)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (GB/s): a 1 GiB fp32
    `copy_` of random data timed eagerly, as `benchmarks.kernels` and the engine bench do (a
    memcpy node inside a CUDA graph runs slower, so graph-timed copies are not the floor)."""
    import triton

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _weights(n: int, k: int, copies: int) -> list[torch.Tensor]:
    return [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * k ** -0.5 for _ in range(copies)]


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def bench_shapes(rows: tuple[int, ...], copy_gbs: float, replays: int, sms: int,
                 shapes: tuple[str, ...] | None = None) -> list[dict]:
    """Kernel (default tiling) vs cuBLAS for every shape (or those named in `shapes`) and row count."""
    results = []
    for name, n, k, _ in SHAPES:
        if shapes is not None and name not in shapes:
            continue
        ws = _weights(n, k, copies_for(2 * n * k))
        calls = calls_for(2 * n * k, len(ws))
        config = default_config(n, k, torch.bfloat16, sms)
        tickets = ticket_buffer("cuda")
        for m in rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            err = _rel_error(small_m_linear(x, ws[0], impl="triton", config=config, tickets=tickets),
                             F.linear(x, ws[0]))
            t_kernel = time_graph_us(lambda i: small_m_linear(x, ws[i % len(ws)], impl="triton", config=config,
                                                              tickets=tickets), calls, replays)
            t_cublas = time_graph_us(lambda i: F.linear(x, ws[i % len(ws)]), calls, replays)
            nbytes = linear_bytes(m, n, k)
            results.append(dict(shape=name, n=n, k=k, m=m, config=config.__dict__, kernel_us=t_kernel,
                                cublas_us=t_cublas, bytes=nbytes, kernel_gbs=nbytes / t_kernel / 1e3,
                                cublas_gbs=nbytes / t_cublas / 1e3,
                                kernel_pct_copy=100 * nbytes / t_kernel / 1e3 / copy_gbs,
                                cublas_pct_copy=100 * nbytes / t_cublas / 1e3 / copy_gbs,
                                speedup=t_cublas / t_kernel, rel_error=err))
        ws.clear()  # the weights go before empty_cache (a del would unbind the timed closures' name)
        torch.cuda.empty_cache()
    return results


def bench_stack(rows: tuple[int, ...], copy_gbs: float, replays: int) -> list[dict]:
    """One decode step's linears of the 8B target (distinct weights per layer) as one graph: the
    kernel through `SmallMLinearMode` (the engine's path) against plain `F.linear`."""
    layers = [[(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * k ** -0.5) for _, n, k in LAYER_LINEARS]
              for _ in range(LAYERS)]
    head = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16, device="cuda") * HIDDEN ** -0.5
    mode = SmallMLinearMode("triton", "cuda")
    shapes = {(n, k) for _, n, k in LAYER_LINEARS} | {(VOCAB, HIDDEN)}
    flipped = SmallMLinearMode("triton", "cuda", configs={  # the default tilings, PDL the other way
        s: dataclasses.replace(c, pdl=not c.pdl) for s in shapes for c in [mode.config_for(*s, torch.bfloat16)]})
    pdl_default = mode.config_for(HIDDEN, HIDDEN, torch.bfloat16).pdl
    qkv_mode = SmallMLinearMode("triton", "cuda", fused=_fused_groups(layers, mlp=False))
    all_mode = SmallMLinearMode("triton", "cuda", fused=_fused_groups(layers, mlp=True))
    results = []
    for m in rows:
        xs = {k: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for k in (HIDDEN, INTER)}

        def step(linear, between=False):
            _stack_step(xs, layers, head, linear, between)

        def routed_step(i, mode=mode, between=False):
            with mode:
                step(F.linear, between)

        t_kernel = time_graph_us(routed_step, 1, replays)
        t_flipped = time_graph_us(lambda i: routed_step(i, flipped), 1, replays)
        t_pdl, t_no_pdl = (t_kernel, t_flipped) if pdl_default else (t_flipped, t_kernel)
        t_cublas = time_graph_us(lambda i: step(F.linear), 1, replays)
        # The same stack with each layer's q, k and v as one launch, then also its gate and up (the
        # engine's layout, `SmallMLinearMode(fused=fusable_groups(...))`: each launch reads the
        # members' weights where they lie): same bytes, 2 and 3 launches fewer per layer.
        def fused_step(i, fused_mode):
            with fused_mode:
                step(F.linear)

        t_fused_qkv = time_graph_us(lambda i: fused_step(i, qkv_mode), 1, replays)
        t_fused = time_graph_us(lambda i: fused_step(i, all_mode), 1, replays)
        t_kernel_between = time_graph_us(lambda i: routed_step(i, between=True), 1, replays)
        t_cublas_between = time_graph_us(lambda i: step(F.linear, between=True), 1, replays)
        nbytes = stack_bytes(m)
        results.append(dict(m=m, kernel_ms=t_kernel / 1e3, kernel_pdl_ms=t_pdl / 1e3, kernel_no_pdl_ms=t_no_pdl / 1e3,
                            cublas_ms=t_cublas / 1e3,
                            bytes=nbytes,
                            floor_ms=nbytes / copy_gbs / 1e6, kernel_pct_copy=100 * nbytes / t_kernel / 1e3 / copy_gbs,
                            cublas_pct_copy=100 * nbytes / t_cublas / 1e3 / copy_gbs, speedup=t_cublas / t_kernel,
                            kernel_fused_qkv_ms=t_fused_qkv / 1e3,
                            kernel_fused_qkv_pct_copy=100 * nbytes / t_fused_qkv / 1e3 / copy_gbs,
                            kernel_fused_ms=t_fused / 1e3,
                            kernel_fused_pct_copy=100 * nbytes / t_fused / 1e3 / copy_gbs,
                            kernel_between_ms=t_kernel_between / 1e3, cublas_between_ms=t_cublas_between / 1e3))
    layers.clear()  # the weights go before empty_cache (the timed closures read these names)
    head = None
    torch.cuda.empty_cache()
    return results


def _fused_groups(layers, mlp: bool) -> list[FusedLinears]:
    """Each layer's q/k/v (and, with `mlp`, gate/up) as one fused group over the layer's own weight
    tensors, as `fusable_groups` builds them for a model."""
    groups = []
    for layer in layers:
        members = [SimpleNamespace(weight=w, bias=None) for w in layer]
        groups.append(FusedLinears(members[:3]))
        if mlp:
            groups.append(FusedLinears(members[4:6]))
    return groups


def _stack_step(xs: dict[int, torch.Tensor], layers, head: torch.Tensor, linear, between: bool = False) -> None:
    """One step's linears: every layer's weights in order, then the head, on the inputs `xs` by K."""
    for layer in layers:
        for w in layer:
            if between:  # a small PyTorch kernel before each linear, as a norm or an add is
                xs[w.shape[1]].mul_(1.0)
            linear(xs[w.shape[1]], w)
    linear(xs[HIDDEN], head)


def bench_wide_stack(rows: tuple[int, ...], copy_gbs: float, replays: int) -> list[dict]:
    """The 8B linear stack past one row tile (verify blocks of batch 8 x 8 or 16 rows, exact mode's
    any-row routing: `SmallMLinearMode(max_rows=None)`), the kernel with its default row groups
    (one weight read per `row_tiles` row tiles) against one row tile per program (a weight read
    per 32 rows) and cuBLAS, with q/k/v and gate/up as one launch each, as in the engine."""
    layers = [[(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * k ** -0.5) for _, n, k in LAYER_LINEARS]
              for _ in range(LAYERS)]
    head = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16, device="cuda") * HIDDEN ** -0.5
    groups = _fused_groups(layers, mlp=True)
    grouped = SmallMLinearMode("triton", "cuda", max_rows=None, fused=groups)
    # the shapes launched: the fused groups', o's and down's, the head's
    shapes = {(g.n, g.k) for g in groups} | {tuple(layers[0][i].shape) for i in (3, 6)} | {(VOCAB, HIDDEN)}
    per_tile = SmallMLinearMode("triton", "cuda", max_rows=None, fused=groups, configs={
        sh: dataclasses.replace(grouped.config_for(*sh, torch.bfloat16), row_tiles=1) for sh in shapes})
    results = []
    for m in rows:
        xs = {k: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for k in (HIDDEN, INTER)}

        def routed(i, mode):
            with mode:
                _stack_step(xs, layers, head, F.linear)

        t = {name: time_graph_us(fn, 1, replays) for name, fn in (
            ("grouped", lambda i: routed(i, grouped)), ("per_tile", lambda i: routed(i, per_tile)),
            ("cublas", lambda i: _stack_step(xs, layers, head, F.linear)))}
        nbytes = stack_bytes(m)
        results.append(dict(m=m, bytes=nbytes, floor_ms=nbytes / copy_gbs / 1e6,
                            **{f"{k}_ms": v / 1e3 for k, v in t.items()},
                            **{f"{k}_pct_copy": 100 * nbytes / v / 1e3 / copy_gbs for k, v in t.items()}))
    layers.clear()
    head = None
    torch.cuda.empty_cache()
    return results


def bench_sweep(rows: tuple[int, ...], copy_gbs: float, replays: int, grid_args: dict,
                shapes: tuple[str, ...] | None = None) -> dict:
    """Every tiling of the grid per shape (or per shape named in `shapes`); returns {shape:
    {"results": [...], "best": row}}."""
    out = {}
    for name, n, k, _ in SHAPES:
        if shapes is not None and name not in shapes:
            continue
        ws = _weights(n, k, copies_for(2 * n * k))
        calls = calls_for(2 * n * k, len(ws))
        xs = {m: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for m in rows}
        tickets = ticket_buffer("cuda")
        results = []
        for config in sweep_grid(k=k, **grid_args):
            try:
                us = {m: time_graph_us(lambda i: small_m_linear(xs[m], ws[i % len(ws)], impl="triton", config=config,
                                                                 tickets=tickets), calls, replays) for m in rows}
            except Exception as exc:  # a tiling the compiler refuses (shared memory, registers)
                results.append(dict(config=config.__dict__, error=f"{type(exc).__name__}: {exc}"[:200]))
                continue
            pct = {m: 100 * linear_bytes(m, n, k) / t / 1e3 / copy_gbs for m, t in us.items()}
            results.append(dict(config=config.__dict__, us=us, pct_copy=pct))
            print(f"sweep {name} {config}: % copy " + " ".join(f"M{m}={p:.1f}" for m, p in pct.items()), flush=True)
        ok = [r for r in results if "us" in r]
        out[name] = dict(n=n, k=k, results=results, best=best_config(ok) if ok else None)
        ws.clear()
        torch.cuda.empty_cache()
    return out


def _print_tables(report: dict) -> None:
    print(f"copy bandwidth: {report['copy_gbs']:.0f} GB/s (read + write)\n")
    print(markdown_table(
        ["shape", "N x K", "M", "kernel us", "cuBLAS us", "kernel GB/s", "cuBLAS GB/s", "kernel % copy",
         "cuBLAS % copy", "speedup"],
        [[r["shape"], f"{r['n']}x{r['k']}", r["m"], r["kernel_us"], r["cublas_us"], r["kernel_gbs"], r["cublas_gbs"],
          r["kernel_pct_copy"], r["cublas_pct_copy"], r["speedup"]] for r in report["shapes"]]))
    print("\n8B linear stack per step (36 layers x q, k, v, o, gate, up, down + lm_head):\n")
    print(markdown_table(
        ["M", "kernel ms", "kernel ms, PDL", "kernel ms, no PDL", "cuBLAS ms", "bytes floor ms", "kernel % copy",
         "cuBLAS % copy", "speedup", "kernel ms, q/k/v fused", "kernel % copy, q/k/v fused",
         "kernel ms, q/k/v + gate/up fused", "kernel % copy, q/k/v + gate/up fused", "kernel ms, a kernel between",
         "cuBLAS ms, a kernel between"],
        [[r["m"], r["kernel_ms"], r["kernel_pdl_ms"], r["kernel_no_pdl_ms"], r["cublas_ms"], r["floor_ms"],
          r["kernel_pct_copy"], r["cublas_pct_copy"], r["speedup"], r["kernel_fused_qkv_ms"],
          r["kernel_fused_qkv_pct_copy"], r["kernel_fused_ms"], r["kernel_fused_pct_copy"], r["kernel_between_ms"],
          r["cublas_between_ms"]]
         for r in report["stack"]]))
    if report.get("wide_stack"):
        print("\n8B linear stack past one row tile (q/k/v and gate/up fused; exact mode's routing):\n")
        print(markdown_table(
            ["M", "bytes floor ms", "kernel ms, row groups", "% copy", "kernel ms, a read per 32 rows", "% copy",
             "cuBLAS ms", "% copy"],
            [[r["m"], r["floor_ms"], r["grouped_ms"], r["grouped_pct_copy"], r["per_tile_ms"], r["per_tile_pct_copy"],
              r["cublas_ms"], r["cublas_pct_copy"]] for r in report["wide_stack"]]))
    if report.get("sweep"):
        print("\nsweep, best tiling per shape (mean % of copy bandwidth over the rows):\n")
        rows = []
        for name, s in report["sweep"].items():
            if s["best"] is not None:
                b = s["best"]
                rows.append([name, json.dumps(b["config"]), statistics.fmean(b["pct_copy"].values()),
                             min(b["pct_copy"].values())])
        print(markdown_table(["shape", "config", "mean % copy", "worst % copy"], rows))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=None, help=f"row counts M (default {ROWS})")
    ap.add_argument("--quick", action="store_true", help=f"rows {QUICK_ROWS}, fewer replays (< 2 min)")
    ap.add_argument("--sweep", action="store_true", help="also time the tiling grid per shape")
    ap.add_argument("--block-n", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--block-k", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--stages", type=int, nargs="+", default=[3, 4, 5])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--pdl", type=int, nargs="+", default=[0], help="1: programmatic dependent launch, 0: off")
    ap.add_argument("--shapes", nargs="+", default=None, choices=[name for name, *_ in SHAPES],
                    help="time (and sweep) only these shapes (default: all)")
    ap.add_argument("--no-stack", action="store_true", help="skip the whole-stack graphs (15 GB of weights)")
    ap.add_argument("--wide-rows", type=int, nargs="*", default=list(WIDE_ROWS),
                    help=f"row counts past {MAX_ROWS} for the stack with row groups (default {WIDE_ROWS}; none: skip)")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    rows = tuple(args.rows or (QUICK_ROWS if args.quick else ROWS))
    if any(not 1 <= m <= MAX_ROWS for m in rows):
        ap.error(f"--rows must lie in 1..{MAX_ROWS}, got {rows}")
    if any(m < 1 for m in args.wide_rows):
        ap.error(f"--wide-rows must be >= 1, got {args.wide_rows}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (this benchmark times GPU kernels)")
    replays = 5 if args.quick else 20
    started = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    report: dict = dict(device=torch.cuda.get_device_name(0), sms=sms, rows=list(rows),
                        copy_gbs=copy_bandwidth_gbs())
    with torch.no_grad():
        shapes = tuple(args.shapes) if args.shapes else None
        report["shapes"] = bench_shapes(rows, report["copy_gbs"], replays, sms, shapes)
        report["stack"] = [] if args.no_stack else bench_stack(rows, report["copy_gbs"], replays)
        report["wide_stack"] = ([] if args.no_stack or not args.wide_rows else
                                bench_wide_stack(tuple(args.wide_rows), report["copy_gbs"], replays))
        if args.sweep:
            grid = dict(block_n=args.block_n, block_k=args.block_k, warps=args.warps, stages=args.stages,
                        splits=args.splits, pdl=args.pdl)
            report["sweep"] = bench_sweep(rows, report["copy_gbs"], max(3, replays // 4), grid, shapes)
            report["best_configs"] = {f"{s['n']}x{s['k']}": s["best"]["config"]
                                      for s in report["sweep"].values() if s["best"] is not None}
    report["seconds"] = time.time() - started
    _print_tables(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
