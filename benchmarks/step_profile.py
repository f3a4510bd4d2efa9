"""Where the engine's decoding step spends its GPU time, and what regional torch.compile buys.

    OUT=/tmp/o python -m benchmarks.step_profile [--shape qwen3-8b] [--variants base,light,full,exact]
        [--budget-s 540]

A `benchmarks.engine` shape (default the Qwen3-8B one; `smollm2-135m` and `qwen2.5-0.5b` are the
small targets whose steps are bound by kernel count), bf16, random weights, the shape's random
DFlash2 draft, context 512 (`benchmarks.engine.build_models`). For each variant of the target:

- **graph ms/step**: median whole-step time of the CUDA-graph engine (replayed steps only) for
  AR, the DFlash2 draft and the device oracle (whose proposals cost almost nothing, so its step
  is the target's verify + commit) at several (batch, N);
- **kernel profile** (`torch.profiler`, CUDA activity): GPU time and launches per step by kernel
  family, from two runs that differ only in their number of steps (the difference removes the
  prefill), and the heaviest kernels; at N > 0 for the DFlash2 arm, the oracle arm and their
  difference kernel by kernel (the draft + select alone: both arms verify the same blocks, and
  neither random proposer gets drafts accepted). `--profile-loops` picks the loop profiled:
  `eager` (the engine without CUDA graphs, every launch from the host; it also runs the checks a
  graph capture skips, such as the draft cache's capacity check) and/or `graphs` (the decoding
  loop users run: the kernels of the replayed step graphs, after a warm-up call as long as the
  longer profiled one, so both profiled calls only replay). The draft + select's kernel time is
  also given as a multiple of its bytes floor: the draft's parameters and the target's LM head
  read once at the copy bandwidth measured at the start of the run.

Variants: `base` = the engine without torch.compile; `light` / `full` = `compile_level="light"` /
`"full"` (`dflash2.engine.compiled`); `exact` = exact mode at its defaults (the batch-invariant
kernels, width 16; no compile, its own linear), so its launches stand beside normal mode's. A
compile is in place, so variants run in the order given on one set of models until a variant
needs another compile level, which gets fresh models. Writes `$OUT/step_profile.json` and
`$OUT/step_profile.md` after every cell.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch


from dflash2.engine import speculative_generate
from benchmarks.engine import SHAPES, build_models
from benchmarks.floors import copy_bandwidth_gbs, sync, weight_bytes
from dflash2.engine.compiled import COMPILE_LEVELS, COMPILED_FLAG
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer

FAMILIES = [  # first match wins (attention before GEMM: some attention kernels are CUTLASS)
    ("attention", re.compile(r"fmha|flash|attention|sdpa|cudnn|softmax|_row_attn_")),
    ("inductor", re.compile(r"^triton_")),
    ("small-M linear", re.compile(r"_small_m_linear")),
    ("norm-RoPE", re.compile(r"_norm_rope")),
    ("dflash2 triton", re.compile(r"_topk_|_selector_|_verify_|_keyed_|_grouped_dynamic_conv|_row_mean")),
    ("gemm", re.compile(r"gemm|gemv|nvjet|xmma|cutlass|splitk|cublas|matmul")),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled")),
    ("reduce", re.compile(r"reduce")),
    ("index/scatter", re.compile(r"scatter|gather|index")),
    ("copy/cat/fill", re.compile(r"copy|cat|memcpy|memset|fill")),
]


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, pat in FAMILIES if pat.search(low)), "other")


def _cuda_kernels(prof) -> dict[str, tuple[int, float]]:
    """{kernel name: (launches, GPU us)} of a finished `torch.profiler.profile`."""
    from torch.autograd import DeviceType

    return {e.key: (e.count, e.self_device_time_total) for e in prof.key_averages() if e.device_type == DeviceType.CUDA}


def kernels(fn) -> dict[str, tuple[int, float]]:
    """{kernel name: (launches, GPU us)} of one call of `fn`."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return _cuda_kernels(prof)


RUNTIME_CALLS = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync",
                 "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaStreamWaitEvent")


def call_profile(go, device: torch.device):
    """`(go(), summary)`: one call under `torch.profiler` (CPU activity, and CUDA on a GPU), the
    device synchronized around it. Summary: `wall_ms` (inflated by the profiler's own per-op
    cost: a diagnosis, not a speed figure); on CUDA `kernel_ms` and `kernels` (GPU kernel time
    and launches, graph replays' kernels included); `runtime` (calls of the CUDA runtime entry
    points in `RUNTIME_CALLS` that launch work or wait for it); `host_top` (the 8 heaviest host
    ops by self CPU time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    sync(device)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        t0 = time.perf_counter()
        out = go()
        sync(device)
        wall = time.perf_counter() - t0
    gpu = _cuda_kernels(prof)
    runtime, host = {}, []
    for e in prof.key_averages():
        if e.device_type == DeviceType.CUDA:
            continue
        if e.key in RUNTIME_CALLS:
            runtime[e.key] = runtime.get(e.key, 0) + e.count
        elif not e.key.startswith(("cuda", "cu")):
            host.append((e.self_cpu_time_total, e.key, e.count))
    host.sort(key=lambda h: -h[0])
    return out, {"wall_ms": wall * 1e3, "kernel_ms": sum(us for _, us in gpu.values()) / 1e3 if cuda else None,
                 "kernels": sum(n for n, _ in gpu.values()) if cuda else None, "runtime": runtime,
                 "host_top": [{"name": k[:90], "calls": c, "self_ms": us / 1e3} for us, k, c in host[:8]]}


def step_profile(run, short: int, long: int, warm: int | None = None) -> dict:
    """Per-step launches and GPU us by family: (profile(long) - profile(short)) / (long - short) steps,
    after an unprofiled warm-up call of `warm` (default `short`) steps."""
    run(short if warm is None else warm)  # warm-up
    a, b = kernels(lambda: run(short)), kernels(lambda: run(long))
    steps = long - short
    per = {}
    for name in set(a) | set(b):
        n = (b.get(name, (0, 0.0))[0] - a.get(name, (0, 0.0))[0]) / steps
        us = (b.get(name, (0, 0.0))[1] - a.get(name, (0, 0.0))[1]) / steps
        if n > 0 or us > 0.5:
            per[name] = (n, us)
    return summarize(per)


def summarize(per: dict[str, tuple[float, float]]) -> dict:
    """Totals, families and the heaviest kernels of a `{name: (launches, us)}` per-step map (kept
    under "per" so profiles can be subtracted: `difference`)."""
    fams: dict[str, list[float]] = {}
    for name, (n, us) in per.items():
        f = fams.setdefault(family(name), [0.0, 0.0])
        f[0] += n
        f[1] += us
    top = sorted(per.items(), key=lambda kv: -kv[1][1])[:14]
    return {"launches": sum(n for n, _ in per.values()), "gpu_us": sum(us for _, us in per.values()),
            "families": {k: {"launches": v[0], "us": v[1]} for k, v in sorted(fams.items(), key=lambda kv: -kv[1][1])},
            "top": [{"name": k[:110], "launches": n, "us": us, "family": family(k)} for k, (n, us) in top],
            "per": {k: list(v) for k, v in per.items()}}


def difference(with_draft: dict, without: dict) -> dict:
    """What one profile adds over another, kernel by kernel (the DFlash2 arm minus the oracle arm
    at the same batch and N, which verify the same blocks: the draft + select's kernels)."""
    per = {}
    for name, (n, us) in with_draft["per"].items():
        n0, us0 = without["per"].get(name, (0.0, 0.0))
        if n - n0 > 0 or us - us0 > 0.5:
            per[name] = (n - n0, us - us0)
    return summarize(per)


def draft_select_floor(target, draft, device: torch.device) -> dict:
    """The draft + select's bytes floor at batch 1: the draft's parameters (its layers, context
    projection and selector, codebooks whole) and the target's LM head, each read once, at the copy
    bandwidth (bytes read + written per second) measured now."""
    copy_gbs = copy_bandwidth_gbs(device)
    head = target.model.get_output_embeddings().weight
    draft_b, head_b = weight_bytes(draft), head.numel() * head.element_size()
    return {"copy_gbs": copy_gbs, "draft_gb": draft_b / 1e9, "head_gb": head_b / 1e9,
            "ms": (draft_b + head_b) / (copy_gbs * 1e9) * 1e3}


def oracle(batch: int, ids: torch.Tensor, vocab: int) -> DeviceOracleProposer:
    refs = [row.tolist() + [7] * 64 for row in ids]
    return DeviceOracleProposer(refs, list(range(batch)), 16, 0.0, vocab, ids.device)


def graph_ms(target, proposer, ids, n: int, new_tokens: int, **kw) -> dict:
    t0 = time.perf_counter()
    out = speculative_generate(target, proposer, ids, max_new_tokens=new_tokens,
                               num_speculative_tokens=n if proposer is not None else None, **kw)
    wall = time.perf_counter() - t0
    t = out.times
    replayed = [v for v, r in zip(t.verify, t.replayed) if r]
    if not replayed:
        raise RuntimeError(f"no graph replay ({t.graph_error})")
    return {"ms_step": statistics.median(replayed) * 1e3, "replays": len(replayed), "steps": len(t.verify),
            "first_call_s": wall}


def render(res: dict) -> str:
    lines = ["# Step profile (`python -m benchmarks.step_profile`)", "", res["meta"], ""]
    lines += ["## Graph ms/step (median of replayed steps)", "",
              "| variant | batch | arm | N | ms/step | first call s |", "| --- | --- | --- | --- | --- | --- |"]
    for c in res["graph"]:
        ms = f"{c['ms_step']:.2f}" if "ms_step" in c else c.get("error", "-")
        lines.append(f"| {c['variant']} | {c['batch']} | {c['arm']} | {c['n']} | {ms} "
                     f"| {c.get('first_call_s', 0):.1f} |")
    for p in res["profiles"]:
        loop = "graph-replayed loop" if p.get("loop") == "graphs" else "eager loop"
        lines += ["", f"## Kernels per step, {loop}: {p['variant']}, batch {p['batch']}, {p['arm']} N={p['n']}", "",
                  f"{p['launches']:.0f} launches, {p['gpu_us'] / 1e3:.2f} ms of kernel time per step", ""]
        f = res.get("floor")
        if p["arm"].startswith("draft + select") and f and p["batch"] == 1:
            lines += [f"{p['gpu_us'] / 1e3 / f['ms']:.3f} x its bytes floor of {f['ms']:.4f} ms "
                      f"(draft {f['draft_gb']:.3f} GB + LM head {f['head_gb']:.3f} GB at {f['copy_gbs']:.0f} GB/s, "
                      "this run's copy bandwidth)", ""]
        lines += ["| family | launches | ms |", "| --- | --- | --- |"]
        lines += [f"| {k} | {v['launches']:.0f} | {v['us'] / 1e3:.3f} |" for k, v in p["families"].items()]
        lines += ["", "| kernel | family | launches | ms |", "| --- | --- | --- | --- |"]
        lines += [f"| `{t['name']}` | {t['family']} | {t['launches']:.0f} | {t['us'] / 1e3:.3f} |" for t in p["top"]]
    return "\n".join(lines) + "\n"


VARIANTS = ("base", *COMPILE_LEVELS, "exact")
EXACT_WIDTH = 16  # the exact variant's width: the draft's block (anchor + 15 drafts)


def variant_kwargs(variant: str, attention_impl: str, linear_impl: str) -> dict:
    """`speculative_generate` settings of a variant: `base` and the compile levels with the given
    attention and linear kernels; `exact` = exact mode at its defaults (its own kernels)."""
    if variant == "exact":
        return {"exact": True, "exact_block_size": EXACT_WIDTH}
    return {"compile_level": None if variant == "base" else variant, "attention_impl": attention_impl,
            "linear_impl": linear_impl}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(s for s in SHAPES if s != "tiny"), default="qwen3-8b")
    ap.add_argument("--variants", default="base,light,full", help="comma list of base, light, full, exact")
    ap.add_argument("--cells", default="1:0,1:15,1:7,8:0,8:7,32:0,32:3", help="batch:N list (N=0: AR)")
    ap.add_argument("--profile-cells", default="1:0,1:15,32:3")
    ap.add_argument("--variant-cells", default="", help="per-variant overrides, e.g. 'base=32:3;full=1:0,1:15'")
    ap.add_argument("--variant-profile-cells", default="", help="the same for --profile-cells ('-' = none)")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--attention-impl", choices=["auto", "torch", "triton"], default="auto",
                    help="the target attention kernel of every run (dflash2.kernels.row_attention)")
    ap.add_argument("--linear-impl", choices=["auto", "torch", "triton"], default="torch",
                    help="the target's and the draft's linears at decode sizes (dflash2.kernels.linear)")
    ap.add_argument("--profile-loops", default="eager",
                    help="comma list of 'eager' (no CUDA graphs) and 'graphs' (replayed step graphs)")
    ap.add_argument("--budget-s", type=float, default=540)
    args = ap.parse_args()
    loops = args.profile_loops.split(",")
    if not loops or any(loop not in ("eager", "graphs") for loop in loops):
        raise SystemExit(f"--profile-loops takes 'eager' and/or 'graphs', got {args.profile_loops!r}")
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    dev = torch.device("cuda")
    target, draft = build_models(args.shape, dev)
    vocab = target.vocab_size
    res = {"meta": f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}; {args.shape} shape bf16 random, "
                   f"{SHAPES[args.shape][1]}-layer draft, context 512, {args.new_tokens} new tokens, attention "
                   f"{args.attention_impl}, linear {args.linear_impl} (variant exact: its own kernels)",
           "floor": draft_select_floor(target, draft, dev), "graph": [], "profiles": []}

    def save() -> None:
        (out / "step_profile.json").write_text(json.dumps(res, indent=1))
        (out / "step_profile.md").write_text(render(res))

    def cells(text):
        return [tuple(int(x) for x in c.split(":")) for c in text.split(",")]

    def overrides(text):
        return dict(item.split("=", 1) for item in text.split(";") if item)

    var_cells, var_prof = overrides(args.variant_cells), overrides(args.variant_profile_cells)
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}: use {', '.join(VARIANTS)}")
        kw = variant_kwargs(variant, args.attention_impl, args.linear_impl)
        done = getattr(target.model, COMPILED_FLAG, None)
        if done is not None and done[0] != kw.get("compile_level"):  # compiles are in place: fresh models
            del target, draft
            torch.cuda.empty_cache()
            target, draft = build_models(args.shape, dev)
        for batch, n in cells(var_cells.get(variant, args.cells)):
            if time.perf_counter() - t_start > args.budget_s:
                break
            ids = torch.randint(0, vocab, (batch, 512), generator=torch.Generator().manual_seed(batch)).to(dev)
            arms = [("AR", None)] if n == 0 else [("dflash2", draft), ("oracle", oracle(batch, ids, vocab))]
            for arm, prop in arms:
                cell = {"variant": variant, "batch": batch, "arm": arm, "n": n}
                try:
                    cell.update(graph_ms(target, prop, ids, n, args.new_tokens, **kw))
                except Exception as e:  # keep the other cells
                    cell["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(cell, flush=True)
                res["graph"].append(cell)
                save()
        prof = var_prof.get(variant, args.profile_cells)
        for batch, n in (cells(prof) if prof != "-" else []):
            if time.perf_counter() - t_start > args.budget_s:
                break
            ids = torch.randint(0, vocab, (batch, 512), generator=torch.Generator().manual_seed(batch)).to(dev)
            for loop in loops:
                arms = [("dflash2", draft), ("oracle", oracle(batch, ids, vocab))] if n else [("AR", None)]
                done = {}
                for arm, prop in arms:
                    def run(new, prop=prop, ids=ids, n=n, graphs=loop == "graphs"):
                        speculative_generate(target, prop, ids, max_new_tokens=new, num_speculative_tokens=n or None,
                                             graphs=graphs, **kw)
                    try:
                        p = done[arm] = step_profile(run, 4, 12, warm=12 if loop == "graphs" else None)
                        p.update(variant=variant, batch=batch, arm=arm, n=n, loop=loop)
                        res["profiles"].append(p)
                        print(f"profile {loop} {variant} b{batch} N{n} {arm}: {p['launches']:.0f} launches "
                              f"{p['gpu_us']:.0f} us", flush=True)
                    except Exception as e:
                        print(f"profile {loop} {variant} b{batch} N{n} {arm} failed: {e}", flush=True)
                if len(done) == 2:  # the draft + select alone: the DFlash2 arm's kernels beyond the oracle's
                    d = difference(done["dflash2"], done["oracle"])
                    d.update(variant=variant, batch=batch, arm="draft + select (dflash2 - oracle)", n=n, loop=loop)
                    res["profiles"].append(d)
                    if batch == 1:
                        print(f"draft + select {loop} b1 N{n}: {d['gpu_us']:.1f} us, {d['launches']:.0f} launches, "
                              f"{d['gpu_us'] / 1e3 / res['floor']['ms']:.3f} x the {res['floor']['ms']:.4f} ms floor "
                              f"({res['floor']['copy_gbs']:.0f} GB/s)", flush=True)
                save()
    from torch._dynamo.utils import counters

    res["dynamo"] = {"stats": dict(counters["stats"]),
                     "graph_breaks": {k[:200]: v for k, v in counters["graph_break"].items()}}
    res["meta"] += f"; wall {time.perf_counter() - t_start:.0f} s; dynamo {res['dynamo']}"
    save()


if __name__ == "__main__":
    main()
