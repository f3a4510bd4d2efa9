"""Engine benchmark: wall-clock per-step time of our AR and speculative steps against HF peers and floors.

    python -m benchmarks.engine --shape qwen3-8b --part 1 --out part1.md --json part1.json
    python -m benchmarks.engine --merge part1.json part2.json part3.json --out engine.md

(from the repository root). Per cell (context, batch, arm), all in one process, on random weights
(cost does not depend on values): HF eager `generate` (DynamicCache), HF static cache +
`torch.compile` (transformers' own generate-time compile, `CompileConfig(mode="reduce-overhead")`),
our AR step (`speculative_generate(target, None, ...)`) and our speculative step at each N with a
real random DFlash2 draft (5 layers at the Qwen3-8B shape), so draft and select cost what they
cost; its proposals are almost never accepted, so tokens/step is ~1 and reported as measured.

Our arms run with `--compile-level` (default `light`: the norms and MLPs torch.compile'd,
`dflash2.engine.compiled`; `full` adds the attention modules; `none`); each shape class's compile
(and the CUDA graphs of every K/V bucket) is paid by an untimed call before the cell. On CPU our
arms run uncompiled.

**ms/step, the same measure for every arm** (`benchmarks.wallclock.wall_step_ms`): (t(1 + K new
tokens) - t(1 token)) / steps, each t the median wall time of `--repeats` whole public-API calls, the device
synchronized only before and after a call; K = `--new-tokens` - 1, steps = K for HF and our AR,
and the decoding steps of the call for a speculative arm (tokens/step = K / steps, about 1 with
the random draft). It includes everything a user pays between steps: the report read, the host
bookkeeping, the next launch. Breakdown columns, ours only: "in-step ms" = the median step of a
`timing=True` call after `--warmup-steps` (the device synchronized after every step; on CUDA a
step is one graph replay, and the phase column splits it as draft + select / verify + commit, the
latter being the step of a run with the device oracle at the same N, which proposes for free), and
"host ms/step" = ms/step - in-step ms, the host time per step left outside the device's work.
Each measured cell also logs one stderr line (and keeps in its JSON `extra`): every whole call's
wall time, the garbage collections inside the whole-length calls, and, for our arms, the last
such call's own step-to-step wall time and graph-launch time (`benchmarks.wallclock`).

The compiled HF cells run last in each call and keep transformers' defaults (a second batch size
recompiles with a dynamic batch dimension), so their peak memory includes the CUDA-graph pools of
the compiled cells before them. Peak memory: `torch.cuda.max_memory_allocated` per cell (weights
included). With a compile level other than `none`, the HF arms run on a second copy of the target
(same seed, same weights), since our compile works in place and the peers must run the stock
modules; each cell's peak then leaves out the bytes of the copy it does not use.

Floors (`benchmarks.floors`), measured in the same process: copy bandwidth, the memory floor
(weights + K/V bytes over it), the GEMM stack on M = batch x (N + 1) rows and the compute floor;
"x floor" = ms/step over the largest. Ratios "x HF eager" / "x HF compile" = the HF arm's ms/step
over this arm's, same context and batch (> 1: this arm's step is faster).

Split into at most three calls of < 10 minutes each on an H200 (`--part`; the grid is
`--context` x `--batch`): part 1 = the smallest context, every batch; part 2 = the other
contexts, every batch but the largest; part 3 = the other contexts, the largest batch. With the
defaults: part 1 = context 512 (batch 1, 8, 32), part 2 = context 4096 (batch 1, 8), part 3 =
context 4096 (batch 32). Results are written after every cell; `--budget-s` (wall time from the
start) skips the remaining cells with "not run (budget)" rows instead of overrunning.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from benchmarks.floors import Floors, weight_bytes
from benchmarks.wallclock import pipelined_readings, wall_step_ms
from dflash2.engine.compiled import COMPILE_LEVELS
from dflash2.kernels.dispatch import resolve_impl
from dflash2.runconfig import DraftSpec, TargetSpec, new_draft, random_target_config

SHAPES = {
    "qwen3-8b": (TargetSpec(name="qwen3-8b-random", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                            dtype="bfloat16"), 5),
    "smollm2-135m": (TargetSpec(name="smollm2-135m-random", architecture="llama", hidden_size=576,
                                intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                num_key_value_heads=3, head_dim=64, vocab_size=49152, rope_theta=100000.0,
                                rms_norm_eps=1e-5, tie_word_embeddings=True, dtype="bfloat16"), 2),
    "qwen2.5-0.5b": (TargetSpec(name="qwen2.5-0.5b-random", architecture="qwen2", hidden_size=896,
                                intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                num_key_value_heads=2, head_dim=64, vocab_size=151936, rope_theta=1000000.0,
                                rms_norm_eps=1e-6, dtype="bfloat16"), 2),
    "tiny": (TargetSpec(name="tiny-random", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                        dtype="float32"), 1),
}
MAX_N = 15  # the draft block is 16 slots: anchor + 15 drafts
HF_EAGER, HF_COMPILE, OURS_AR = "HF eager", "HF static+compile", "ours AR"
EXACT_SUFFIX = " exact"  # our arm in exact mode (--exact-impl)
NOT_RUN_BUDGET = "not run (budget)"
NA_CPU = "n/a on CPU"
# Prior duration (s) of a cell kind before one has run: the first compile is the long one.
PRIOR_S = {"hf_compile": 150.0}
TARGET_SHAPE, TARGET_DEVICE = "qwen3-8b", "H200"


def arm_name(n: int) -> str:
    return OURS_AR if n == 0 else f"ours N={n}"


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,8,32") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, e.g. 1,8,32")
    return vals


def select_part(contexts: list[int], batches: list[int], part: str) -> list[tuple[int, int]]:
    """(context, batch) cells of `part` (module docstring). Returns them in run order."""
    cells = [(c, b) for c in sorted(set(contexts)) for b in sorted(set(batches))]
    if part == "all":
        return cells
    c0, bmax = min(contexts), max(batches)
    keep = {"1": lambda c, b: c == c0, "2": lambda c, b: c > c0 and b < bmax, "3": lambda c, b: c > c0 and b == bmax}
    return [cell for cell in cells if keep[part](*cell)]


# ---------------------------------------------------------------------------------- arms

def _peak_start(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _log_cell(cell: dict) -> None:
    """One stderr line per measured cell: the wall figure and the readings behind it."""
    ex = cell.get("extra") or {}
    fmt = lambda xs: "/".join(f"{x:.1f}" for x in xs)  # noqa: E731
    parts = [f"{cell['arm']} b{cell['batch']} ctx {cell['context']}: {cell['status']}"]
    if cell.get("ms_step") is not None:
        parts.append(f"{cell['ms_step']:.3f} ms/step")
    if ex.get("calls_ms"):
        parts.append(f"calls {fmt(ex['calls_ms'])} ms, 1-token calls {fmt(ex['one_token_calls_ms'])} ms")
    if "gc_pauses" in ex:
        parts.append(f"{ex['gc_pauses']} collections in the whole-length calls, {ex['gc_ms']:.1f} ms "
                     f"(max {ex['gc_max_ms']:.1f})")
    if ex.get("pipelined_step_ms") is not None:
        parts.append(f"pipelined step median {ex['pipelined_step_ms']:.3f} max {ex['pipelined_step_max_ms']:.3f} ms")
    if ex.get("launch_ms") is not None:
        parts.append(f"replay launch median {ex['launch_ms']:.3f} max {ex['launch_max_ms']:.3f} ms")
    print("; ".join(parts), file=sys.stderr)


def _oracle_step_ms(target, ids: torch.Tensor, n: int, new_tokens: int, warmup_steps: int,
                    engine_kw: dict) -> float:
    """Median synchronized step (ms) with `DeviceOracleProposer` at N = n, accepting nothing: the
    verify + commit part of a speculative step (its proposal is a few gathers)."""
    from dflash2.engine.generate import speculative_generate
    from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer

    oracle = DeviceOracleProposer([row.tolist() for row in ids], list(range(ids.shape[0])), MAX_N + 1, 0.0,
                                  int(target.vocab_size), ids.device)
    t = speculative_generate(target, oracle, ids, max_new_tokens=new_tokens, num_speculative_tokens=n, timing=True,
                             **engine_kw).times
    return statistics.median(t.verify[warmup_steps:]) * 1e3


def run_ours(target, draft, ids: torch.Tensor, n: int, new_tokens: int, warmup_steps: int,
             engine_kw: dict | None = None, repeats: int = 3) -> dict:
    """Our AR (n = 0) or speculative step at N = n: wall ms/step (`wall_step_ms`), and as a
    breakdown the synchronized in-step time and its phases (ms). `engine_kw`: the engine's
    kernel choices (`compile_level`, `attention_impl`, `linear_impl`), the same for every call of
    the cell. The decoding state the engine keeps for a next call is freed afterwards, so no
    later cell's peak memory holds it."""
    from dflash2.engine.kept import release_decode_state

    try:
        return _run_ours(target, draft, ids, n, new_tokens, warmup_steps, dict(engine_kw or {}), repeats)
    finally:
        release_decode_state(target)


def _run_ours(target, draft, ids: torch.Tensor, n: int, new_tokens: int, warmup_steps: int,
              engine_kw: dict, repeats: int) -> dict:
    from dflash2.engine.generate import speculative_generate

    drafter = draft if n > 0 else None
    kw = dict(num_speculative_tokens=n if n > 0 else None, **engine_kw)

    last_full: list = []  # the last whole-length call's output: its per-step host readings

    def call(m: int) -> None:
        out = speculative_generate(target, drafter, ids, max_new_tokens=m, **kw)
        if m == new_tokens:
            last_full[:] = [out]

    # Untimed: the compile of this shape class, the graphs of every K/V bucket, the kept state.
    out = speculative_generate(target, drafter, ids, max_new_tokens=new_tokens, **kw)
    steps = max(map(len, out.accepted))  # decoding steps with a row still generating
    ms, extra = wall_step_ms(call, new_tokens, steps, repeats, ids.device)
    extra.update(pipelined_readings(last_full[0].times, warmup_steps))
    # The breakdown: the same call with the device synchronized after every step (timing=True).
    t = speculative_generate(target, drafter, ids, max_new_tokens=new_tokens, timing=True, **kw).times
    if len(t.verify) <= warmup_steps:
        raise RuntimeError(f"only {len(t.verify)} steps for --warmup-steps {warmup_steps}; raise --new-tokens")
    extra.update(prefill_ms=t.prefill * 1e3, graph_replays=t.graph_replays, graph_captures=t.graph_captures)
    med = lambda xs: statistics.median(xs[warmup_steps:]) * 1e3  # noqa: E731
    if t.graph_replays:
        # A replayed step is one graph: `verify` holds the whole step, there are no phase readings.
        # The split comes from a second run whose proposer costs nothing: the device oracle at the
        # same N (accepting nothing, as the random draft does) runs the same verify + commit, so
        # draft + select = this step - that step.
        in_step = med(t.verify)
        phases = {"draft": None, "select": None, "verify": None}
        if n > 0:
            verify_ms = _oracle_step_ms(target, ids, n, new_tokens, warmup_steps, engine_kw)
            phases = {"draft_select": in_step - verify_ms, "verify": verify_ms, "method": "oracle difference"}
    else:
        steps_run = len(t.verify)
        draft_s, select_s = t.draft or [0.0] * steps_run, t.select or [0.0] * steps_run
        in_step = med([d + s + v for d, s, v in zip(draft_s, select_s, t.verify)])
        phases = {"draft": med(draft_s), "select": med(select_s), "verify": med(t.verify)}
    return {"ms_step": ms, "in_step_ms": in_step, "host_ms_step": ms - in_step,
            "tokens_step": out.stats()["tau_pooled"], "phases_ms": phases, "extra": extra}


def hf_generate(model, ids: torch.Tensor, max_new_tokens: int, compiled: bool, *,
                attention_mask: torch.Tensor | None = None, eos_token_id: list[int] | None = None,
                pad_token_id: int = 0) -> torch.Tensor:
    """One greedy HF `generate` call, the peer of every benchmark: `compiled` = static cache +
    `torch.compile` (transformers' generate-time compile, `CompileConfig(mode="reduce-overhead")`),
    else eager with a DynamicCache. `ids`: `[B, P]` (left-padded where `attention_mask` [B, P] has
    zeros; None = all ones). `eos_token_id` None: exactly `max_new_tokens` tokens per row; else rows
    stop at any of those ids and are padded with `pad_token_id`. Returns `[B, P + new]` (HF's output)."""
    from dflash2.engine.compiled import eager_forward

    kw = dict(attention_mask=torch.ones_like(ids) if attention_mask is None else attention_mask, do_sample=False,
              pad_token_id=pad_token_id, eos_token_id=eos_token_id)
    if eos_token_id is None:
        kw["min_new_tokens"] = max_new_tokens
    if compiled:
        from transformers import CompileConfig

        kw.update(cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead"))
    else:
        kw.update(disable_compile=True)
    # The eager peer runs the stock code even where our arms compiled modules in place before
    # (the compiled peer traces the whole model itself, inlining those modules).
    with torch.no_grad(), eager_forward(not compiled):
        return model.generate(ids, max_new_tokens=max_new_tokens, **kw)


def run_hf(model, ids: torch.Tensor, new_tokens: int, compiled: bool, repeats: int) -> dict:
    """HF `generate` per-step time by `wall_step_ms` over new_tokens - 1 steps, after one warm-up call."""
    def call(n: int) -> None:
        hf_generate(model, ids, n, compiled)

    t0 = time.perf_counter()
    call(new_tokens)  # warm-up: compiles the decode forward for the compiled arm
    warm_s = time.perf_counter() - t0
    ms, extra = wall_step_ms(call, new_tokens, new_tokens - 1, repeats, ids.device)
    extra["warmup_s"] = warm_s
    if compiled:
        extra["compiled"] = hasattr(model, "_compiled_call")  # transformers' generate-time compile ran
    return {"ms_step": ms, "in_step_ms": None, "host_ms_step": None, "tokens_step": 1.0, "phases_ms": None,
            "extra": extra}


# ---------------------------------------------------------------------------------- ratios, tables

def add_ratios(cells: list[dict]) -> None:
    """Fill `tokens_s`, `x_hf_eager`, `x_hf_compile`, `x_floor` of every ok cell from raw ms/step."""
    ok = {(c["context"], c["batch"], c["arm"]): c for c in cells if c["status"] == "ok"}
    for c in cells:
        c["tokens_s"] = c["x_hf_eager"] = c["x_hf_compile"] = c["x_floor"] = None
        if c["status"] != "ok":
            continue
        c["tokens_s"] = c["batch"] * c["tokens_step"] / (c["ms_step"] / 1e3)
        for key, arm in (("x_hf_eager", HF_EAGER), ("x_hf_compile", HF_COMPILE)):
            ref = ok.get((c["context"], c["batch"], arm))
            c[key] = ref["ms_step"] / c["ms_step"] if ref else None
        if c.get("floors"):
            c["x_floor"] = c["ms_step"] / c["floors"]["floor_ms"]
        if c["arm"].endswith(EXACT_SUFFIX):  # exact mode's cost: its step over the normal arm's, same run
            normal = ok.get((c["context"], c["batch"], c["arm"][: -len(EXACT_SUFFIX)]))
            c["exact_cost"] = c["ms_step"] / normal["ms_step"] if normal else None


def _f(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _arm_order(c: dict) -> tuple:
    return ({HF_EAGER: 0, HF_COMPILE: 1}.get(c["arm"], 2), c["n"], c["arm"].endswith(EXACT_SUFFIX))


def targets(cells: list[dict]) -> list[tuple[str, str, str]]:
    """(target, measured, met | missed | not run) for issue 21's targets (item 4), all in wall clock."""
    ok = {(c["context"], c["batch"], c["arm"]): c for c in cells if c["status"] == "ok"}
    rows = []

    def check(label: str, key: tuple, value, ok_fn, fmt) -> None:
        c = ok.get(key)
        v = value(c) if c else None
        status = "not run" if v is None else ("met" if ok_fn(v) else "missed")
        rows.append((label, "-" if v is None else fmt(v), status))

    ms = lambda c: c["ms_step"]  # noqa: E731
    host = lambda c: c.get("host_ms_step")  # noqa: E731
    times = lambda v: f"{v:.2f}x"  # noqa: E731
    n15 = arm_name(15)
    check("AR step, batch 1, context 512 <= 4.6 ms", (512, 1, OURS_AR), ms, lambda v: v <= 4.6, lambda v: f"{v:.2f} ms")
    check("AR step >= 1.6x faster than HF static+compile (batch 1, context 512)", (512, 1, OURS_AR),
          lambda c: c["x_hf_compile"], lambda v: v >= 1.6, times)
    check("gate: AR step >= 1.3x faster than HF static+compile (batch 1, context 512)", (512, 1, OURS_AR),
          lambda c: c["x_hf_compile"], lambda v: v >= 1.3, times)
    check("speculative step N=15, batch 1, context 512 <= 6.0 ms", (512, 1, n15), ms, lambda v: v <= 6.0,
          lambda v: f"{v:.2f} ms")
    check("gate: N=15 step faster than HF static+compile's token (batch 1, context 512)", (512, 1, n15),
          lambda c: c["x_hf_compile"], lambda v: v > 1.0, times)
    for arm in (OURS_AR, n15):
        check(f"host ms/step <= 0.1 ({arm}, batch 1, context 512)", (512, 1, arm), host, lambda v: v <= 0.1,
              lambda v: f"{v:.3f} ms")
    contexts = sorted({c["context"] for c in cells}) or [512]
    for batch, n in ((8, 7), (32, 3)):
        for ctx in contexts:
            ar = ok.get((ctx, batch, OURS_AR))
            check(f"spec step N={n} within 1.25x of AR step, batch {batch}, context {ctx}", (ctx, batch, arm_name(n)),
                  lambda c, ar=ar: c["ms_step"] / ar["ms_step"] if ar else None, lambda v: v <= 1.25, times)
    return rows


def render(runs: list[dict]) -> str:
    """Markdown: header (commands, device), one table per context, floors, targets."""
    cells = [c for r in runs for c in r["cells"]]
    add_ratios(cells)
    m0 = runs[0]["meta"]
    lines = ["# Engine benchmark (`python -m benchmarks.engine`)", ""]
    for r in runs:
        m = r["meta"]
        lines.append(f"- part {m['part']}: `{m['command']}` ({m['wall_s']:.0f} s wall)")
    levels = sorted({r["meta"].get("compile_level", "none") for r in runs})
    attn = sorted({r["meta"].get("attention_impl", "torch") for r in runs})
    lines += ["", f"Our arms' compile level: {', '.join(levels)} (`dflash2.engine.compiled`); attention kernel: "
              f"{', '.join(attn)} (`dflash2.kernels.row_attention`).", "",
              f"Device: {m0['device_name']} | torch {m0['torch']} | transformers {m0['transformers']} | "
              f"shape {m0['shape']} ({m0['shape_desc']}) | {m0['new_tokens']} new tokens per cell; in-step "
              f"medians over the steps after {m0['warmup_steps']} warm-up steps", "",
              "ms/step: every arm alike, wall clock over whole calls: (t(1 + K tokens) - t(1 token)) / steps, "
              f"medians of {m0.get('repeats', 3)} calls, the device synchronized only around a call. in-step ms "
              "(ours, a breakdown): median step of a call synchronized after every step; host ms/step = ms/step - "
              "in-step ms. x HF eager / x HF compile = that arm's ms/step over this row's (> 1 = faster); x floor = "
              "ms/step over the largest floor of the cell (see Floors). Our speculative arms use a random DFlash2 "
              "draft: tokens/step is as measured, not a drafter's.", ""]
    for ctx in sorted({c["context"] for c in cells}):
        lines += [f"## Context {ctx}", "",
                  "| batch | arm | ms/step | in-step ms | host ms/step | tokens/step | tokens/s | x HF eager | "
                  "x HF compile | x floor | in-step phases ms: draft / select / verify (graphs: draft+select / "
                  "verify) | peak GiB |", "|" + " --- |" * 12]
        for c in sorted((c for c in cells if c["context"] == ctx), key=lambda c: (c["batch"], _arm_order(c))):
            if c["status"] != "ok":
                lines.append(f"| {c['batch']} | {c['arm']} | {c['status']} | | | | | | | | | |")
                continue
            ph = c["phases_ms"]
            if ph is None:
                phases = "-"
            elif ph.get("method") == "oracle difference":
                phases = f"{ph['draft_select']:.2f} / {ph['verify']:.2f} (oracle diff.)"
            elif ph["verify"] is None:
                phases = "one graph replay"  # the whole step was captured: no phase boundaries to read
            else:
                phases = f"{ph['draft']:.2f} / {ph['select']:.2f} / {ph['verify']:.2f}"
            peak = NA_CPU if c["peak_gib"] is None else f"{c['peak_gib']:.1f}"
            lines.append(f"| {c['batch']} | {c['arm']} | {_f(c['ms_step'])} | {_f(c.get('in_step_ms'))} | "
                         f"{_f(c.get('host_ms_step'), 3)} | {_f(c['tokens_step'])} | "
                         f"{_f(c['tokens_s'], 1)} | {_f(c['x_hf_eager'])} | {_f(c['x_hf_compile'])} | "
                         f"{_f(c['x_floor'])} | {phases} | {peak} |")
        lines.append("")
    exact = [c for c in cells if c["arm"].endswith(EXACT_SUFFIX) and c["status"] == "ok"]
    if exact:
        lines += ["## Exact mode's cost", "", "Exact arm's ms/step over the same N's normal arm's, same run (exact "
                  f"mode: `exact_block_size` {MAX_N + 1}, `exact_impl` {m0.get('exact_impl')}, compile level "
                  f"{exact_level(m0.get('compile_level', 'none'), m0.get('exact_impl', 'none')) or 'none'}; the "
                  "normal arms at this run's compile level).", "",
                  "| context | batch | arm | exact ms/step | cost ratio |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {c['context']} | {c['batch']} | {c['arm']} | {_f(c['ms_step'])} | {_f(c.get('exact_cost'))} |"
                  for c in sorted(exact, key=lambda c: (c["context"], c["batch"], c["n"]))]
        lines.append("")
    lines += ["## Floors", ""]
    for r in runs:
        g = r["floors"]
        lines.append(f"- part {r['meta']['part']}: copy bandwidth {_f(g['copy_gbs'], 0)} GB/s (read + write), GEMM "
                     f"{_f(g['gemm_tflops'], 1)} TFLOP/s, target linear params {g['linear_params']:.4g}, "
                     f"K/V {g['kv_bytes_per_token'] / 1e3:.1f} kB per token and row")
    lines += ["", "| context | batch | arm | M rows | weights GB | K/V GB | memory ms | GEMM stack ms | compute ms |",
              "|" + " --- |" * 9]
    for c in sorted((c for c in cells if c.get("floors")), key=lambda c: (c["context"], c["batch"], _arm_order(c))):
        f = c["floors"]
        lines.append(f"| {c['context']} | {c['batch']} | {c['arm']} | {f['m_rows']} | {f['weights_gb']:.4g} | "
                     f"{f['kv_gb']:.4g} | {f['memory_ms']:.3f} | {f['gemm_stack_ms']:.3f} | {f['compute_ms']:.3f} |")
    lines += ["", f"## Targets (issue 21 item 4, wall clock: {TARGET_DEVICE}, --shape {TARGET_SHAPE}; this run: "
              f"{m0['device_name']}, --shape {m0['shape']})", "",
              "| target | measured | status |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {s} |" for a, b, s in targets(cells)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- main

def build_models(shape: str, device: torch.device, seed: int = 0):
    """(TargetModel, draft) with random weights, built on `device` directly."""
    from transformers import AutoModelForCausalLM

    from dflash2.target import TargetModel

    spec, draft_layers = SHAPES[shape]
    dtype = getattr(torch, spec.dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(random_target_config(spec), dtype=dtype).eval()
        target = TargetModel(hf)
        target.requires_grad_(False)
        draft = new_draft(DraftSpec(num_hidden_layers=draft_layers, block_size=MAX_N + 1), target, seed=seed)
    draft = draft.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return target, draft


def exact_level(level: str, exact_impl: str) -> str | None:
    """The compile level of an exact arm beside normal arms at `level` (`"none"`, `"light"`,
    `"full"`): exact mode compiles at `"light"` at most, and not at all with `exact_impl="rows"`."""
    if level == "none" or exact_impl == "rows":
        return None
    return "light"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--batch", type=_ints, default=[1, 8, 32])
    p.add_argument("--context", type=_ints, default=[512, 4096], help="prompt tokens per row")
    p.add_argument("--n", type=_ints, default=[1, 3, 7, 15], help=f"speculative tokens N, each in 1..{MAX_N}")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per cell (steps timed)")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3,
                   help="whole calls per timing, every arm (the median: single-call times vary from run to run, "
                        "HF compile's most)")
    p.add_argument("--part", choices=["1", "2", "3", "all"], default="all")
    p.add_argument("--arms", default="hf_eager,hf_compile,ours", help="subset of hf_eager,hf_compile,ours")
    p.add_argument("--attention-impl", choices=["auto", "torch", "triton"], default="auto",
                   help="our arms' target attention kernel (dflash2.kernels.row_attention; auto = the engine's "
                        "default, Triton on CUDA; torch = SDPA + mask)")
    p.add_argument("--linear-impl", choices=["auto", "torch", "triton"], default="auto",
                   help="our arms' linear layers (dflash2.kernels.linear: triton = the small-M kernel, inside "
                        "compiled modules too; torch = F.linear; auto = the engine's default, triton on CUDA)")
    p.add_argument("--compile-level", choices=["auto", "none", *COMPILE_LEVELS], default="auto",
                   help="our arms' compile_level (dflash2.engine.compiled; auto = the engine's default, light on "
                        "CUDA; none = stock modules); the compile of each shape class is paid in an untimed run "
                        "before the cell")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall seconds from start; later cells are skipped")
    p.add_argument("--exact-impl", choices=["none", "rows", "invariant"], default="none",
                   help="also run each of our arms in exact mode with this exact_impl (exact_block_size 16, "
                        "compiled as --compile-level where exact mode takes it: light at most, none with rows); "
                        "the table gets the cost ratio exact / normal per arm")
    p.add_argument("--out", type=Path, help="Markdown file")
    p.add_argument("--json", type=Path, help="raw numbers (JSON)")
    p.add_argument("--merge", type=Path, nargs="+", help="render --out from these --json files; measure nothing")
    a = p.parse_args(argv)
    if a.merge:
        if not a.out:
            p.error("--merge needs --out FILE.md")
        return a
    bad = [n for n in a.n if n > MAX_N]
    if bad:
        p.error(f"--n {','.join(map(str, bad))}: N must be in 1..{MAX_N} (the draft block is {MAX_N + 1} slots)")
    if a.warmup_steps < 0 or a.repeats < 1:
        p.error("--warmup-steps must be >= 0 and --repeats >= 1")
    if a.new_tokens < a.warmup_steps + 3:
        p.error(f"--new-tokens {a.new_tokens}: needs at least --warmup-steps + 3 = {a.warmup_steps + 3} "
                "(steps after warm-up to take a median of)")
    unknown = set(a.arms.split(",")) - {"hf_eager", "hf_compile", "ours"}
    if unknown:
        p.error(f"--arms: unknown {sorted(unknown)}; use a subset of hf_eager,hf_compile,ours")
    a.device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                            ("cpu" if a.device == "auto" else a.device))
    if a.device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {a.device}: CUDA is not available here; use --device cpu --shape tiny")
    if a.shape == "qwen3-8b" and a.device.type != "cuda":
        p.error("--shape qwen3-8b needs a CUDA device (16 GB of bf16 weights); use --shape tiny on CPU")
    a.grid = select_part(a.context, a.batch, a.part)
    if not a.grid:
        p.error(f"--part {a.part} selects no cell of --context {a.context} x --batch {a.batch} "
                "(parts 2 and 3 need a second, larger context)")
    if max(a.context) + a.new_tokens + MAX_N + 1 > SHAPES[a.shape][0].max_position_embeddings:
        p.error(f"--context {max(a.context)} + --new-tokens {a.new_tokens} exceeds the model's positions")
    return a


def main(argv: list[str] | None = None) -> dict | None:
    """Run the benchmark (or merge); writes `--out` / `--json` after every cell. Returns the run."""
    args = parse_args(argv)
    if args.merge:
        runs = [json.loads(Path(p).read_text()) for p in args.merge]
        args.out.write_text(render(runs))
        print(f"wrote {args.out} from {len(runs)} runs", file=sys.stderr)
        return None
    from tqdm import tqdm
    import transformers

    t_start = time.perf_counter()
    dev = args.device
    spec, draft_layers = SHAPES[args.shape]
    dtype = getattr(torch, spec.dtype)
    target, draft = build_models(args.shape, dev)
    level = args.compile_level if dev.type == "cuda" else "none"
    if level == "auto":  # the engine's default: light on CUDA (dflash2.engine.inputs.resolve_compile)
        level = "light" if dev.type == "cuda" else "none"
    hf_arms = {"hf_eager", "hf_compile"} & set(args.arms.split(","))
    # Our compile is in place: the peers get their own stock copy (same seed = same weights).
    hf_model = build_models(args.shape, dev)[0].model if level != "none" and hf_arms else target.model
    idle_bytes = {"ours": 0, "hf": 0}  # parameter bytes of the copy a cell does not use
    if hf_model is not target.model:
        idle_bytes = {"ours": weight_bytes(hf_model), "hf": weight_bytes(target.model) + weight_bytes(draft)}
    floors = Floors(target.model, draft, dev, dtype)
    arms = args.arms.split(",")
    command = "python -m benchmarks.engine " + shlex.join(argv if argv is not None else sys.argv[1:])
    run = {"meta": {"command": command,
                    "part": args.part, "shape": args.shape,
                    "shape_desc": f"{spec.num_hidden_layers} layers, H {spec.hidden_size}, I {spec.intermediate_size}, "
                                  f"{spec.num_attention_heads}/{spec.num_key_value_heads} heads, hd {spec.head_dim}, "
                                  f"V {spec.vocab_size}, {spec.dtype}, random weights; draft {draft_layers} layers",
                    "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU",
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "new_tokens": args.new_tokens, "warmup_steps": args.warmup_steps, "repeats": args.repeats,
                    "wall_s": 0.0,
                    "compile_level": level, "attention_impl": resolve_impl(args.attention_impl, dev),
                    "linear_impl": resolve_impl(args.linear_impl, dev), "exact_impl": args.exact_impl},
           "floors": {"copy_gbs": floors.copy_gbs, "gemm_tflops": floors.gemm_tflops,
                      "linear_params": floors.linear_params, "target_weight_bytes": floors.target_bytes,
                      "draft_weight_bytes": floors.draft_bytes, "kv_bytes_per_token": floors.kv_bytes_per_token},
           "cells": []}

    def save() -> None:
        run["meta"]["wall_s"] = time.perf_counter() - t_start
        add_ratios(run["cells"])
        if args.json:
            args.json.write_text(json.dumps(run, indent=1))
        if args.out:
            args.out.write_text(render([run]))

    # (context, batch, kind, n): ours and HF eager first, then every compiled cell, so the compiled
    # arm's CUDA-graph pools (kept between its cells) never sit in the other arms' peak memory.
    plan = []
    for ctx, batch in args.grid:
        plan += [(ctx, batch, "ours", n) for n in ([0] + sorted(set(args.n))) if "ours" in arms]
        if args.exact_impl != "none" and "ours" in arms:
            plan += [(ctx, batch, "ours_exact", n) for n in ([0] + sorted(set(args.n)))]
        plan += [(ctx, batch, "hf_eager", 0)] if "hf_eager" in arms else []
    plan += [(ctx, batch, "hf_compile", 0) for ctx, batch in args.grid if "hf_compile" in arms]
    last_s = dict(PRIOR_S) if dev.type == "cuda" else {}
    for ctx, batch, kind, n in tqdm(plan, desc="engine bench", file=sys.stderr):
        name = {"hf_eager": HF_EAGER, "hf_compile": HF_COMPILE}.get(kind, arm_name(n))
        name += EXACT_SUFFIX if kind == "ours_exact" else ""
        cell = {"context": ctx, "batch": batch, "arm": name, "n": n, "kind": kind, "part": args.part,
                "status": "ok", "peak_gib": None, "floors": None}
        elapsed = time.perf_counter() - t_start
        if kind == "hf_compile" and dev.type != "cuda":
            cell["status"] = NA_CPU  # reduce-overhead = CUDA graphs
        elif elapsed + last_s.get(kind, 0.0) > args.budget_s:
            cell["status"] = NOT_RUN_BUDGET
        else:
            # Random ids, the same for every arm (and part) of the cell.
            gen = torch.Generator().manual_seed(ctx * 1000 + batch)
            ids = torch.randint(0, spec.vocab_size, (batch, ctx), generator=gen).to(dev)
            t0 = time.perf_counter()
            _peak_start(dev)
            try:
                if kind.startswith("ours"):
                    engine_kw = (dict(compile_level=None if level == "none" else level,
                                      attention_impl=args.attention_impl, linear_impl=args.linear_impl)
                                 if kind == "ours" else  # exact mode picks its own kernels; compiled at light at most
                                 dict(exact=True, exact_block_size=MAX_N + 1, exact_impl=args.exact_impl,
                                      compile_level=exact_level(level, args.exact_impl)))
                    res = run_ours(target, draft, ids, n, args.new_tokens, args.warmup_steps, engine_kw, args.repeats)
                else:
                    res = run_hf(hf_model, ids, args.new_tokens, kind == "hf_compile", args.repeats)
                peak = _peak_gib(dev)
                if peak is not None:
                    peak -= idle_bytes["ours" if kind.startswith("ours") else "hf"] / 2**30
                cell.update(res, peak_gib=peak, floors=floors.cell(ctx, batch, n))
            except Exception as e:  # record and go on: one failing arm must not lose the others
                traceback.print_exc()
                cell["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            last_s[kind] = time.perf_counter() - t0
            cell["cell_s"] = last_s[kind]
            _log_cell(cell)
        run["cells"].append(cell)
        save()
    save()
    if not args.out:
        print(render([run]))
    return run


if __name__ == "__main__":
    main()
