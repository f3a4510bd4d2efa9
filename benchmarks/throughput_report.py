"""Statistics and Markdown of `benchmarks.throughput`: tokens/s, speedups and their 95 % CIs.

A cell is one arm of one table (mode, batch) with its units (oracle mode: timed calls; real mode:
prompt chunks), each unit's generated tokens and wall seconds. Its tokens/s = the units' tokens
summed / their seconds summed. Intervals are percentile bootstrap intervals (numpy, seeded): in real
mode one set of resampled chunk indices serves every arm of the table (the arms ran the same chunks,
so the speedups are paired); in oracle mode each arm's calls are resampled with its own seeded
stream (independent calls). A speedup's resampled values are the ratio of the two arms' resampled
tokens/s (the same indices when paired). Fewer than two units give no interval.
"""

from __future__ import annotations

import zlib

import numpy as np

from benchmarks.engine import HF_COMPILE, NA_CPU

ORACLE, REAL = "oracle", "real"
CONFIDENCE = 0.95
_ORDER = {"hf_eager": 0, "hf_compile": 1, "ar": 2, "oracle": 3, "projection": 3, "dflash2": 3}


def tables(cells: list[dict]) -> list[tuple[str, int]]:
    """The (mode, batch) keys of the tables, in print order."""
    return sorted({(c["mode"], c["batch"]) for c in cells})


def interval(draws: np.ndarray) -> list[float]:
    """The central `CONFIDENCE` percentile interval `[low, high]` of bootstrap draws."""
    lo, hi = np.percentile(draws, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    return [float(lo), float(hi)]


def add_stats(cells: list[dict], n_resamples: int, seed: int) -> None:
    """Fill `tokens_s`, `x_ar`, `x_hf_compile` and their `*_ci` (`[low, high]` or None) of every
    cell from its raw `tokens` / `seconds`; None where the cell or the reference arm did not run.
    Deterministic for a given seed. Raises ValueError when the arms of a real-mode table have
    different unit counts (they must have run the same chunks)."""
    for mode, batch in tables(cells):
        group = [c for c in cells if (c["mode"], c["batch"]) == (mode, batch)]
        ok = [c for c in group if c["status"] == "ok" and c["tokens"]]
        if mode == REAL and len({len(c["tokens"]) for c in ok}) > 1:
            raise ValueError(f"real mode, batch {batch}: arms ran different chunk counts, cannot pair them")
        draws: dict[int, np.ndarray] = {}
        for c in group:
            for key in ("tokens_s", "x_ar", "x_hf_compile"):
                c[key] = c[f"{key}_ci"] = None
        for c in ok:
            tok, sec = np.asarray(c["tokens"], dtype=float), np.asarray(c["seconds"], dtype=float)
            c["tokens_s"] = float(tok.sum() / sec.sum())
            if len(tok) < 2:
                continue
            arm_key = zlib.crc32(f"{c['kind']}|{c['n']}|{c['p']}".encode())
            stream = [seed, batch] if mode == REAL else [seed, batch, arm_key]  # paired: one stream per table
            idx = np.random.default_rng(stream).integers(0, len(tok), size=(n_resamples, len(tok)))  # [R, units]
            draws[id(c)] = tok[idx].sum(axis=1) / sec[idx].sum(axis=1)
            c["tokens_s_ci"] = interval(draws[id(c)])
        refs = {kind: next((c for c in ok if c["kind"] == kind), None) for kind in ("ar", "hf_compile")}
        for c in ok:
            for key, ref in (("x_ar", refs["ar"]), ("x_hf_compile", refs["hf_compile"])):
                if ref is None:
                    continue
                c[key] = c["tokens_s"] / ref["tokens_s"]
                if id(c) in draws and id(ref) in draws:
                    c[f"{key}_ci"] = interval(draws[id(c)] / draws[id(ref)])


# ---------------------------------------------------------------------------------- Markdown

def _value(v: float | None, ci: list[float] | None, digits: int) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def _notes(c: dict) -> str:
    notes = [c["notes"]] if c.get("notes") else []
    caps = [x for x in c.get("captures", []) if x]
    if caps and c["kind"] != "projection":
        notes.append(f"{sum(caps) / len(c['captures']):.1f} CUDA-graph captures per timed call (in its wall)")
    return "; ".join(notes)


def _row(c: dict) -> str:
    n = str(c["n"]) if c["n"] else "-"
    p = "-" if c["p"] is None else f"{c['p']:g}"
    if c["status"] != "ok":
        return f"| {c['arm']} | {n} | {p} | {c['status']} | | | | | |"
    tau = "-" if c["tau"] is None else f"{c['tau']:.2f}"
    same = "-" if c["identical"] is None else f"{c['identical'][0]}/{c['identical'][1]}"
    x_ar = "reference" if c["kind"] == "ar" else _value(c["x_ar"], c["x_ar_ci"], 2)
    x_hf = "reference" if c["kind"] == "hf_compile" else _value(c["x_hf_compile"], c["x_hf_compile_ci"], 2)
    return (f"| {c['arm']} | {n} | {p} | {_value(c['tokens_s'], c['tokens_s_ci'], 1)} | {x_ar} | {x_hf} | "
            f"{tau} | {same} | {_notes(c)} |")


def _mode_text(m: dict) -> str:
    if m["mode"] == ORACLE:
        return (f"Oracle mode: {m['target']}; {m['context']} random prompt tokens per row, {m['max_new_tokens']} new "
                f"tokens per row (no stop tokens), {m['repeats']} timed calls per arm after one warm-up; CIs resample "
                "each arm's calls. \"ours + oracle\": `DeviceOracleProposer` proposing our AR's tokens, each slot "
                "right with probability p, new coins per call. \"+ draft (projection)\": the same calls' wall plus "
                "their steps x the random DFlash2 draft's draft + select time per step at that N, measured in this "
                "run: a projection, not a measured run of a drafter that accepts at p.")
    fmt = m.get("prompt_format", {})
    return (f"Real mode: target {m['target']} ({m.get('dtype', 'its config dtype')}), drafter `{m['draft_path']}` "
            f"(block {m.get('draft_block_size')}); the "
            f"first {m.get('prompts')} GSM8K test questions (`--limit {m['limit']}`) in the eval runner's chat format "
            f"(prompt format {fmt.get('hash')}), greedy, at most {m['max_new_tokens']} new tokens per row, stop tokens "
            f"{m.get('stop_token_ids')}; per batch, consecutive full chunks of the prompts, the same for every arm; "
            "CIs resample the chunks, paired across arms.")


def _order(c: dict) -> tuple:
    """Peers, our AR, then our other arms by N and p, each projection after its oracle arm."""
    return _ORDER[c["kind"]], c["n"], -1 if c["p"] is None else c["p"], c["kind"] == "projection"


def render(run: dict) -> str:
    """Markdown: command, device, mode, how it is measured, then one table per (mode, batch)."""
    m, cells = run["meta"], run["cells"]
    lines = ["# Throughput: what a user gets (`python -m benchmarks.throughput`)", "",
             f"`{m['command']}` ({m['wall_s']:.0f} s wall)", "",
             f"Device: {m['device_name']} | torch {m['torch']} | transformers {m['transformers']} | our arms: compile "
             f"level {m['compile_level']}, attention {m['attention_impl']}, linear {m['linear_impl']}", "",
             _mode_text(m), "",
             "tokens/s: generated tokens of all rows (stop tokens included) / wall seconds of whole calls, summed "
             "over the units, the device synchronized only around a call, after one untimed warm-up call per arm and "
             f"batch. x ours AR / x {HF_COMPILE}: this row's tokens/s over that arm's (> 1 = faster). [a, b]: "
             f"{CONFIDENCE:.0%} percentile bootstrap interval ({m['n_resamples']} resamples, seed {m['seed']}). tau: "
             "mean tokens per step including the bonus. rows = AR: rows whose tokens equal our AR's (greedy; the "
             "engine is lossless, so in fp32 a row that differs is flagged here; in bf16 outside exact mode a "
             "verify block's kernels can flip a 0-1 ulp near-tie, and the row then follows its own path)."]
    if m.get("hf_compile_on_cpu"):
        lines += ["", f"{HF_COMPILE}: {NA_CPU} (CUDA graphs); HF eager ran in its place."]
    for mode, batch in tables(cells):
        group = [c for c in cells if (c["mode"], c["batch"]) == (mode, batch)]
        unit = (f"{m['repeats']} timed calls per arm" if mode == ORACLE else
                f"{m['chunks'][str(batch)]} chunks of {batch} prompts, "
                f"{m['prompts'] - m['chunks'][str(batch)] * batch} prompts left out")
        lines += ["", f"## {mode.capitalize()} mode, batch {batch} ({unit})", "",
                  f"| arm | N | p | tokens/s [95 % CI] | x ours AR [95 % CI] | x {HF_COMPILE} [95 % CI] | tau | "
                  "rows = AR | notes |", "|" + " --- |" * 9]
        lines += [_row(c) for c in sorted(group, key=_order)]
    profiled = [c for c in cells if c.get("profile")]
    if profiled:
        lines += ["", "## One more call per arm under the profiler (`--profile`; a diagnosis, not a figure)", "",
                  "The arm's warm-up unit once more under `torch.profiler` (its wall includes the profiler's own "
                  "cost). GPU busy = kernel time / wall; launches and waits are counts of CUDA runtime calls per "
                  "decoding step.",
                  "", "| mode | batch | arm | N | p | steps | wall ms | GPU kernel ms | GPU busy | kernels / step | "
                  "graph launches / step | host kernel launches / step | syncs / step | copies / step | "
                  "heaviest host op (self ms) |", "|" + " --- |" * 15]
        lines += [_profile_row(c) for c in sorted(profiled, key=lambda c: (c["mode"], c["batch"], *_order(c)))]
    return "\n".join(lines) + "\n"


def _profile_row(c: dict) -> str:
    pr = c["profile"]
    rt, steps = pr["runtime"], max(pr.get("steps") or 1, 1)

    def per_step(*names: str) -> str:
        return f"{sum(rt.get(n, 0) for n in names) / steps:.1f}"

    gpu, wall = pr["kernel_ms"], pr["wall_ms"]
    gpu_cols = ["-", "-", "-"] if gpu is None else [f"{gpu:.1f}", f"{gpu / wall:.0%}", f"{pr['kernels'] / steps:.0f}"]
    top = pr["host_top"][0] if pr["host_top"] else None
    cols = [c["mode"], c["batch"], c["arm"], c["n"] or "-", "-" if c["p"] is None else c["p"],
            "-" if pr.get("steps") is None else pr["steps"], f"{wall:.1f}", *gpu_cols, per_step("cudaGraphLaunch"),
            per_step("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"),
            per_step("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize"),
            per_step("cudaMemcpyAsync"), "-" if top is None else f"`{top['name']}` ({top['self_ms']:.1f})"]
    return "| " + " | ".join(map(str, cols)) + " |"
