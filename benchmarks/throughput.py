"""Throughput benchmark, what a user gets: tokens/s and speedups with 95 % CIs (issue 21 item 5).

    python -m benchmarks.throughput --shape qwen3-8b --batch 1,8 --n 7,15 --accept 0.6,0.8,0.9 \\
        --compile-level full --out oracle.md --json oracle.json
    python -m benchmarks.throughput --target smollm2-135m --draft-path CKPT --batch 1,8 --n 3,7 \\
        --out smollm2.md --json smollm2.json

(from the repository root). Two modes, one table format (one table per mode and batch):

- **Oracle mode** (`--shape`, random weights as in `benchmarks.engine`): `--context` random prompt
  tokens per row. Our AR greedy call gives each row's first reference (prompt + generated); for
  each N in `--n` and p in `--accept` the arm `speculative_generate(target, DeviceOracleProposer(...))`
  proposes a reference, each slot right with probability p (`dflash2.evaluation.arms.oracle_proposers`), with
  the same engine kwargs as our AR. In bf16 a verify can flip a near-tie and leave our AR's text,
  after which that reference would propose only wrong drafts; so untimed passes replace the
  reference by the arm's own output until a call reproduces it (`own_path_references`; the notes
  give the passes), and each slot is then right with probability p along the arm's own path.
  The settled proposer object serves the warm-up and every timed call (coins keyed by row and
  position, the same in every call), so the engine keeps its decoding state and the timed calls
  replay its CUDA graphs, as our DFlash2 arm's do.
  The oracle proposes for free, so per (batch, N) the random DFlash2 draft's draft + select cost
  per step is measured in the same run (`benchmarks.engine.run_ours`: the oracle difference on
  the graph path, the synchronized phases elsewhere) and a **projection** row gives tokens /
  (wall + steps x that cost): tokens/s if each step of the oracle call had also run the draft.
- **Real mode** (`--target NAME --draft-path CKPT`): the target of `configs/target/NAME.yaml`
  (loaded as the evaluation loads it, `dflash2.runconfig.load_target`), its drafter checkpoint,
  the first `--limit` GSM8K test questions in the target's chat format as `eval/run.py` builds them
  (the default data config: no thinking, no system prompt, no few-shot), greedy, the target's stop
  tokens. Batches are consecutive chunks of the prompts (a last, partial chunk is left out); every
  arm runs the same chunks. Arms: our AR and our DFlash2 drafter at each N.

Peers in both modes (`--arms`): HF static cache + `torch.compile` generate, HF eager generate
(`benchmarks.engine.hf_generate`); on CPU the compiled peer is "n/a on CPU" and HF eager runs in its
place. All arms run in one process and one run.

**Measurement, every arm alike**: wall clock of whole public-API calls, the device synchronized only
before and after a call, after one untimed warm-up call per arm and batch (compiles, graph captures,
the engine's kept state; real mode warms up on the chunk with the longest prompt, so HF's static
cache and our state are sized for every chunk). tokens/s = generated tokens of all rows (stop
tokens included, counted from the outputs; HF's up to and including each row's first stop) / wall
seconds, summed over the units: `--repeats` calls (oracle mode) or the chunks (real mode). Speedups:
an arm's tokens/s over our AR's and over HF static+compile's, same batch. CIs: 95 % percentile
bootstrap (`--n-resamples`, seeded by `--seed`), in real mode over the chunks paired across arms,
in oracle mode over each arm's calls, resampled per arm. tau = mean tokens per step including the
bonus (`dflash2.engine.stats.tau_pooled`). "rows = AR": rows whose tokens equal our AR's (greedy
arms; the engine is lossless, so in fp32 a speedup of a run whose rows differ is flagged by this
column; in bf16 outside exact mode a verify's kernels can flip a near-tie).
The notes give the graph captures per timed call (0 once the warm-up captured every K/V bucket).

`--out` (Markdown) and `--json` (raw numbers) are written after every cell; `--budget-s` (wall
seconds from the start) skips the remaining cells with "not run (budget)" rows. `--profile` runs
each arm's warm-up unit once more under `torch.profiler` after its timed calls and adds a table of
GPU busy time, launches, waits and the heaviest host ops per arm: a diagnosis, in no figure.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.engine import (HF_COMPILE, HF_EAGER, MAX_N, NA_CPU, NOT_RUN_BUDGET, OURS_AR, PRIOR_S, SHAPES, _ints,
                               build_models, hf_generate, run_ours)
from benchmarks.floors import sync
from benchmarks.throughput_report import ORACLE, REAL, add_stats, render
from dflash2.engine.compiled import COMPILE_LEVELS
from dflash2.kernels.dispatch import resolve_impl

ORACLE_ARM, PROJECTION_ARM, DFLASH2_ARM = "ours + oracle", "ours + oracle + draft (projection)", "ours DFlash2"
NOT_RUN_NO_AR = "not run (no AR reference)"
PROBE_MIN_TOKENS, PROBE_WARMUP_STEPS = 16, 3  # the draft-cost probe's call and the steps its medians skip
MAX_REF_PASSES = 12  # oracle mode: calls spent finding references on the arm's own path
DEFAULT_N = {ORACLE: [7, 15], REAL: [3, 7]}
wall_clock = time.perf_counter  # the clock of `timed` (a module attribute: tests may replace it)


# ---------------------------------------------------------------------------------- calls

@dataclass
class Call:
    """One call's outputs: per row the generated tokens (stop token included); for our arms the
    accepted drafts per row and step, and the CUDA graphs the call captured."""

    rows: list[list[int]]
    accepted: list[list[int]] | None = None
    captures: int = 0

    @property
    def steps(self) -> int | None:
        """Decoding steps of the call with a row still generating (None for HF)."""
        return None if self.accepted is None else max(map(len, self.accepted), default=0)


def timed(go, device: torch.device):
    """`(go(), seconds)`: the wall clock of one whole call, the device synchronized only around it."""
    sync(device)
    t = wall_clock()
    out = go()
    sync(device)
    return out, wall_clock() - t


def ours_prepare(target, drafter, prompts, n: int, max_new_tokens: int, stops: list[int] | None, engine_kw: dict):
    """`(go, finish)` of one `speculative_generate` call (AR when `drafter` is None)."""
    from dflash2.engine.generate import speculative_generate

    def go():
        return speculative_generate(target, drafter, prompts, max_new_tokens=max_new_tokens,
                                    num_speculative_tokens=n if drafter is not None else None, temperature=0.0,
                                    seed=0, stop_token_ids=stops, **engine_kw)

    def finish(out) -> Call:
        return Call([g.tolist() for g in out.generated], [list(a) for a in out.accepted], out.times.graph_captures)

    return go, finish


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(ids [B, P], mask [B, P])`: prompts left-padded to the longest (HF generate's batch layout)."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[b, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def hf_prepare(model, ids: torch.Tensor, mask: torch.Tensor | None, max_new_tokens: int, compiled: bool,
               stops: list[int] | None, pad_id: int):
    """`(go, finish)` of one HF generate call on `ids [B, P]`; `finish` keeps each row's tokens up to
    and including its first stop (all `max_new_tokens` of them without stops)."""
    stop_set = set(stops or ())

    def go():
        return hf_generate(model, ids, max_new_tokens, compiled, attention_mask=mask, eos_token_id=stops or None,
                           pad_token_id=pad_id)

    def finish(out) -> Call:
        rows = []
        for row in out[:, ids.shape[1]:].tolist():
            rows.append(row[:next((i + 1 for i, t in enumerate(row) if t in stop_set), len(row))])
        return Call(rows)

    return go, finish


def measure(cell: dict, prepare, units: list, warm, device: torch.device, reference: dict | None = None,
            profile: bool = False) -> list[Call]:
    """One untimed warm-up call `prepare(warm)`, then one timed call per unit; fills the cell's raw
    numbers (per unit: tokens, seconds, steps, captures; tau; rows = AR against `reference`, a
    unit -> AR rows map). `prepare(unit) -> (go, finish)`: only `go()` is timed. `profile`: one
    more call of `warm` afterwards, under the profiler (`cell["profile"]`,
    `benchmarks.step_profile.call_profile`), outside every figure."""
    from dflash2.engine.stats import tau_pooled

    go, finish = prepare(warm)
    finish(go())
    calls = []
    for unit in units:
        go, finish = prepare(unit)
        raw, seconds = timed(go, device)
        call = finish(raw)
        calls.append(call)
        cell["tokens"].append(sum(map(len, call.rows)))
        cell["seconds"].append(seconds)
        cell["steps"].append(call.steps)
        cell["captures"].append(call.captures)
    if profile:
        from benchmarks.step_profile import call_profile

        go, finish = prepare(warm)
        raw, cell["profile"] = call_profile(go, device)
        cell["profile"]["steps"] = finish(raw).steps
    if calls[0].accepted is not None:
        cell["tau"] = tau_pooled([a for c in calls for a in c.accepted])
    if reference is not None:
        same = sum(r == ref for u, c in zip(units, calls) for r, ref in zip(c.rows, reference[u]))
        cell["identical"] = [same, sum(len(c.rows) for c in calls)]
    return calls


def own_path_references(refs: list[list[int]], prompt_lens: list[int], run, max_passes: int = MAX_REF_PASSES):
    """`(refs, passes)`: references the oracle arm reproduces, so each slot is right with probability
    p along the arm's own greedy path. In bf16 a verify block's kernels can flip a near-tie, and past
    that token our AR's reference proposes for another text (every later draft wrong). `run(refs)`
    is one call of the arm proposing `refs` (coins keyed by row and position, the same every call);
    its rows become the next references until a call reproduces them. Each pass keeps the tokens
    before the first difference and fixes that one (its logits see only earlier tokens), so it
    moves forward; `passes` is None if `max_passes` calls did not settle."""
    for k in range(1, max_passes + 1):
        rows = run(refs)
        new = [ref[:n] + row for ref, n, row in zip(refs, prompt_lens, rows)]
        if new == refs:
            return refs, k
        refs = new
    return refs, None


def new_cell(mode: str, batch: int, arm: str, kind: str, n: int = 0, p: float | None = None) -> dict:
    return {"mode": mode, "batch": batch, "arm": arm, "kind": kind, "n": n, "p": p, "status": "ok", "tokens": [],
            "seconds": [], "steps": [], "captures": [], "tau": None, "identical": None, "notes": ""}


# ---------------------------------------------------------------------------------- the two modes

def oracle_plan(args, target, draft, hf_model, engine_kw: dict) -> list[tuple[dict, object]]:
    """Cells of oracle mode with their runners, in run order: per batch our AR (the references), the
    oracle arms, the draft probes with their projections, HF eager; then every HF compile cell."""
    from dflash2.engine.sampling import row_seed
    from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer

    dev, k, vocab = args.device, args.max_new_tokens, int(target.vocab_size)
    units = list(range(args.repeats))
    plan, compiled = [], []
    for batch in args.batch:
        gen = torch.Generator().manual_seed(args.context * 1000 + batch)  # the same ids for every arm
        ids = torch.randint(0, vocab, (batch, args.context), generator=gen).to(dev)
        ctx: dict = {}  # this batch's AR rows and references, filled when its AR cell runs

        def run_ar(cell, ids=ids, ctx=ctx):
            calls = measure(cell, lambda _: ours_prepare(target, None, ids, 0, k, None, engine_kw), units, -1, dev,
                            profile=args.profile)
            ctx["ar"] = {u: calls[-1].rows for u in units}  # greedy: every call gives the same rows
            ctx["refs"] = [row.tolist() + new for row, new in zip(ids.cpu(), calls[-1].rows)]

        plan.append((new_cell(ORACLE, batch, OURS_AR, "ar"), run_ar))
        oracles = {(n, p): new_cell(ORACLE, batch, ORACLE_ARM, "oracle", n, p) for n in args.n for p in args.accept}
        for n in args.n:
            for p in args.accept:
                def run_oracle(cell, ids=ids, ctx=ctx, n=n, p=p, batch=batch):
                    seeds = [row_seed(1, b) for b in range(batch)]
                    made = {}

                    def call(refs):  # one untimed call proposing `refs`; its proposer is kept for reuse
                        made["oracle"] = DeviceOracleProposer(refs, seeds, MAX_N + 1, p, vocab, dev)
                        go, finish = ours_prepare(target, made["oracle"], ids, n, k, None, engine_kw)
                        return finish(go()).rows

                    _, passes = own_path_references(ctx["refs"], [ids.shape[1]] * batch, call)
                    cell["reference_passes"] = passes
                    cell["notes"] = (f"reference: the arm's own greedy path ({passes} untimed passes)" if passes else
                                     f"reference: not settled after {MAX_REF_PASSES} passes (tau is a lower bound)")
                    # The settled proposer serves the warm-up and every timed call: the engine keeps the
                    # decoding state of a graph-safe proposer object, so the timed calls replay its graphs.
                    oracle = made["oracle"]
                    measure(cell, lambda _: ours_prepare(target, oracle, ids, n, k, None, engine_kw), units, -1, dev,
                            ctx["ar"], profile=args.profile)

                plan.append((oracles[n, p], run_oracle))
        for n in args.n:
            probe = new_cell(ORACLE, batch, PROJECTION_ARM, "projection", n)
            probe["projections"] = [new_cell(ORACLE, batch, PROJECTION_ARM, "projection", n, p) for p in args.accept]

            def run_probe(cell, ids=ids, n=n, oracles=oracles):
                res = run_ours(target, draft, ids, n, max(k, PROBE_MIN_TOKENS), PROBE_WARMUP_STEPS, engine_kw, 1)
                ph = res["phases_ms"]
                draft_ms = cell["draft_ms"] = ph["draft_select"] if "draft_select" in ph else ph["draft"] + ph["select"]
                for proj in cell["projections"]:
                    src = oracles[n, proj["p"]]  # run (or skipped) before this probe
                    if src["status"] != "ok":
                        proj["status"] = src["status"]
                        continue
                    proj.update(tokens=list(src["tokens"]), steps=list(src["steps"]), tau=src["tau"],
                                seconds=[s + st * draft_ms / 1e3 for s, st in zip(src["seconds"], src["steps"])],
                                draft_ms=draft_ms, draft_probe=res,
                                notes=f"projection: oracle wall + steps x {draft_ms:.3f} ms (random draft's "
                                      "draft + select, measured in this run)")

            plan.append((probe, run_probe))
        for kind, arm in (("hf_eager", HF_EAGER), ("hf_compile", HF_COMPILE)):
            if kind in args.hf_arms:
                def run_hf(cell, ids=ids, ctx=ctx, kind=kind):
                    prep = hf_prepare(hf_model, ids, None, k, kind == "hf_compile", None, 0)
                    measure(cell, lambda _: prep, units, -1, dev, ctx["ar"], profile=args.profile)

                (compiled if kind == "hf_compile" else plan).append((new_cell(ORACLE, batch, arm, kind), run_hf))
    return plan + compiled  # the compiled peer's graph pools never sit under the other arms


def gsm8k_prompts(tok, limit: int, source: str):
    """`(prompts, fmt)`: the first `limit` GSM8K test questions as token ids, built as the eval
    runner builds them (`datasets.messages_for` + `runconfig.encode_chat`) under the default
    data config's prompt format."""
    from dflash2.evaluation.running import datasets as ds
    from dflash2.runconfig import encode_chat, prompt_format

    fmt = prompt_format(tok)
    items = ds.load_items("gsm8k", source=source, limit=limit)
    return [encode_chat(tok, ds.messages_for(it, 1, [], few_shot=0, source=source), fmt) for it in items], fmt


def load_real(target_name: str, draft_path: str, device: torch.device, hf_copy: bool, dtype: str | None = None):
    """`(target, tokenizer, draft, hf_model)` of real mode: the target as `eval/run.py` loads it
    (`configs/target/<name>.yaml`, a `.gguf` file or a hub id; `dtype` overrides its dtype), its
    drafter checkpoint checked against it (and cast to its dtype), and the HF model the peers run
    (a second copy when `hf_copy`: our compile works in place and the peers must run the stock
    modules)."""
    from dflash2.runconfig import target_spec
    from dflash2.modeling import DFlash2DraftModel
    from dflash2.runconfig import load_target

    spec = target_spec(target_name, dtype=dtype)
    target, tok = load_target(spec, device)
    if not (Path(draft_path) / "config.json").is_file():
        raise FileNotFoundError(f"--draft-path {draft_path} has no config.json; give a draft checkpoint directory")
    draft = DFlash2DraftModel.from_pretrained(draft_path, dtype=target.dtype, device=device)
    target.check_compatible(draft.config)
    hf_model = load_target(spec, device)[0].model if hf_copy else target.model
    return target, tok, draft.eval().requires_grad_(False), hf_model


def real_plan(args, target, tok, draft, hf_model, engine_kw: dict, meta: dict) -> list[tuple[dict, object]]:
    """Cells of real mode with their runners, in run order: per batch our AR, our DFlash2 at each
    N, HF eager; then every HF compile cell. Every arm runs the same chunks of the prompts."""
    from dflash2.evaluation.running.runner import draft_training_format_hash
    from dflash2.runconfig import stop_token_ids

    dev, k = args.device, args.max_new_tokens
    prompts, fmt = gsm8k_prompts(tok, args.limit, args.data_source)
    stops = stop_token_ids(tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    trained = draft_training_format_hash(args.draft_path)
    meta.update(prompts=len(prompts), stop_token_ids=stops, prompt_format=fmt.to_dict(),
                draft_format_hash=trained, draft_block_size=int(draft.block_size))
    if trained is not None and trained != fmt.hash:
        print(f"WARNING: drafter distilled on prompt format {trained}, this run uses {fmt.hash}: acceptance will be "
              "lower than the drafter can reach", file=sys.stderr)
    plan, compiled = [], []
    for batch in args.batch:
        chunks = [prompts[i:i + batch] for i in range(0, len(prompts) - batch + 1, batch)]
        units = list(range(len(chunks)))
        warm = max(units, key=lambda c: max(map(len, chunks[c])))  # the longest prompt sizes every cache
        ctx: dict = {}

        def run_ours_arm(cell, chunks=chunks, units=units, warm=warm, ctx=ctx):
            drafter = draft if cell["kind"] == "dflash2" else None  # main() runs it only after our AR
            calls = measure(cell, lambda c: ours_prepare(target, drafter, chunks[c], cell["n"], k, stops, engine_kw),
                            units, warm, dev, ctx.get("ar"), profile=args.profile)
            if drafter is None:
                ctx["ar"] = {u: c.rows for u, c in zip(units, calls)}

        plan.append((new_cell(REAL, batch, OURS_AR, "ar"), run_ours_arm))
        plan += [(new_cell(REAL, batch, DFLASH2_ARM, "dflash2", n), run_ours_arm) for n in args.n]
        for kind, arm in (("hf_eager", HF_EAGER), ("hf_compile", HF_COMPILE)):
            if kind in args.hf_arms:
                def run_hf(cell, chunks=chunks, units=units, warm=warm, ctx=ctx, kind=kind):
                    def prepare(c):
                        ids, mask = left_pad(chunks[c], pad_id, dev)
                        return hf_prepare(hf_model, ids, mask, k, kind == "hf_compile", stops, pad_id)
                    measure(cell, prepare, units, warm, dev, ctx.get("ar"), profile=args.profile)

                (compiled if kind == "hf_compile" else plan).append((new_cell(REAL, batch, arm, kind), run_hf))
        meta.setdefault("chunks", {})[str(batch)] = len(chunks)
    return plan + compiled


# ---------------------------------------------------------------------------------- command line

def _floats(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 0.6,0.8,0.9") from None
    bad = [v for v in vals if not 0.0 <= v <= 1.0]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: p must be in [0, 1], e.g. 0.6,0.8,0.9")
    return vals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b", help="oracle mode: random weights")
    p.add_argument("--target", help="real mode: configs/target/NAME.yaml (or a .gguf file / hub id)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="real mode: the target's dtype (default: its config's, e.g. float32 for smollm2-135m)")
    p.add_argument("--draft-path", help="real mode: the drafter checkpoint directory")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--batch", type=_ints, default=[1, 8])
    p.add_argument("--n", type=_ints, help=f"speculative tokens N, each in 1..{MAX_N} (default: oracle 7,15; real 3,7)")
    p.add_argument("--accept", type=_floats, default=[0.6, 0.8, 0.9], help="oracle mode: acceptance p per slot")
    p.add_argument("--context", type=int, default=512, help="oracle mode: prompt tokens per row")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens generated per row (cap in real mode)")
    p.add_argument("--repeats", type=int, default=5, help="oracle mode: timed calls per arm (the bootstrap units)")
    p.add_argument("--limit", type=int, default=64, help="real mode: the first LIMIT GSM8K test questions")
    p.add_argument("--data-source", choices=["auto", "hub", "local"], default="auto",
                   help="real mode: GSM8K from the hub or the copy shipped in dflash2/data "
                        "(dflash2.evaluation.running.datasets)")
    p.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--arms", default="hf_compile,ours", help="subset of hf_eager,hf_compile,ours (ours required)")
    p.add_argument("--attention-impl", choices=["auto", "torch", "triton"], default="auto",
                   help="our arms' target attention kernel (as in benchmarks.engine)")
    p.add_argument("--linear-impl", choices=["auto", "torch", "triton"], default="auto",
                   help="our arms' linear layers (as in benchmarks.engine: triton = the small-M kernel; "
                        "torch = F.linear; auto = the engine's default, triton on CUDA)")
    p.add_argument("--compile-level", choices=["auto", "none", *COMPILE_LEVELS], default="auto",
                   help="our arms' compile_level (dflash2.engine.compiled; auto = the engine's default, light on "
                        "CUDA); paid in the warm-up call")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall seconds from start; later cells are skipped")
    p.add_argument("--profile", action="store_true",
                   help="after each arm's timed calls, one more call under torch.profiler: GPU busy time, launches, "
                        "syncs and the heaviest host ops per arm (a diagnosis, outside every figure)")
    p.add_argument("--out", type=Path, help="Markdown file")
    p.add_argument("--json", type=Path, help="raw numbers (JSON)")
    a = p.parse_args(argv)
    a.mode = REAL if a.target or a.draft_path else ORACLE
    if a.target and not a.draft_path:
        p.error("--target needs --draft-path CKPT (the drafter checkpoint directory)")
    if a.draft_path and not a.target:
        p.error("--draft-path needs --target NAME (e.g. smollm2-135m)")
    if a.dtype and a.mode != REAL:
        p.error("--dtype is for real mode (--target); oracle mode's --shape fixes its dtype")
    a.n = a.n or DEFAULT_N[a.mode]
    bad = [n for n in a.n if n > MAX_N]
    if bad:
        p.error(f"--n {','.join(map(str, bad))}: N must be in 1..{MAX_N} (the draft block is {MAX_N + 1} slots)")
    if a.repeats < 2 or a.n_resamples < 100 or a.max_new_tokens < 2 or a.limit < 1 or a.context < 1:
        p.error("need --repeats >= 2, --n-resamples >= 100, --max-new-tokens >= 2, --limit >= 1, --context >= 1")
    if a.mode == REAL and a.limit < max(a.batch):
        p.error(f"--limit {a.limit} is smaller than --batch {max(a.batch)}: no full chunk of prompts")
    arms = set(a.arms.split(","))
    if arms - {"hf_eager", "hf_compile", "ours"} or "ours" not in arms:
        p.error(f"--arms {a.arms}: use a subset of hf_eager,hf_compile,ours that includes ours "
                "(our AR is every ratio's reference)")
    a.device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                            ("cpu" if a.device == "auto" else a.device))
    if a.device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {a.device}: CUDA is not available here; use --device cpu")
    # On CPU the compiled peer is n/a; HF eager runs in its place.
    a.hf_arms = arms - {"ours"} | ({"hf_eager"} if "hf_compile" in arms and a.device.type != "cuda" else set())
    if a.mode == ORACLE:
        if a.shape == "qwen3-8b" and a.device.type != "cuda":
            p.error("--shape qwen3-8b needs a CUDA device (16 GB of bf16 weights); use --shape tiny on CPU")
        if a.context + max(a.max_new_tokens, PROBE_MIN_TOKENS) + MAX_N + 1 > SHAPES[a.shape][0].max_position_embeddings:
            p.error(f"--context {a.context} + --max-new-tokens {a.max_new_tokens} exceeds the model's positions")
    a.parser = p
    return a


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; writes `--out` / `--json` after every cell. Returns the run (meta, cells)."""
    from tqdm import tqdm
    import transformers

    args = parse_args(argv)
    t_start = time.perf_counter()
    dev = args.device
    level = args.compile_level if dev.type == "cuda" else "none"
    if level == "auto":  # the engine's default: light on CUDA (dflash2.engine.inputs.resolve_compile)
        level = "light" if dev.type == "cuda" else "none"  # on CPU our arms run uncompiled
    engine_kw = dict(compile_level=None if level == "none" else level, attention_impl=args.attention_impl,
                     linear_impl=args.linear_impl)
    hf_copy = level != "none" and bool(args.hf_arms)
    command = "python -m benchmarks.throughput " + shlex.join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command, "mode": args.mode,
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "batch": args.batch, "n": args.n, "max_new_tokens": args.max_new_tokens,
            "n_resamples": args.n_resamples, "seed": args.seed, "compile_level": level,
            "attention_impl": resolve_impl(args.attention_impl, dev),
            "linear_impl": resolve_impl(args.linear_impl, dev),
            "hf_compile_on_cpu": "hf_compile" in args.arms.split(",") and dev.type != "cuda", "wall_s": 0.0}
    if args.mode == ORACLE:
        target, draft = build_models(args.shape, dev)
        hf_model = build_models(args.shape, dev)[0].model if hf_copy else target.model
        spec, draft_layers = SHAPES[args.shape]
        meta.update(shape=args.shape, context=args.context, repeats=args.repeats, accept=args.accept,
                    target=f"{spec.name} ({spec.num_hidden_layers} layers, H {spec.hidden_size}, V {spec.vocab_size}, "
                           f"{spec.dtype}, random weights; random draft {draft_layers} layers)")
        plan = oracle_plan(args, target, draft, hf_model, engine_kw)
    else:
        try:
            target, tok, draft, hf_model = load_real(args.target, args.draft_path, dev, hf_copy, args.dtype)
        except FileNotFoundError as e:  # a missing asset or checkpoint: one line, nothing written
            args.parser.exit(2, f"error: {e}\n")
        if max(args.n) >= draft.block_size:
            args.parser.error(f"--n {max(args.n)}: this drafter's block is {draft.block_size} slots, so N must be "
                              f"in 1..{draft.block_size - 1}")
        meta.update(target=args.target, draft_path=args.draft_path, limit=args.limit, data_source=args.data_source,
                    dtype=str(target.dtype).removeprefix("torch."))
        plan = real_plan(args, target, tok, draft, hf_model, engine_kw, meta)
    run = {"meta": meta, "cells": []}

    def save() -> None:
        meta["wall_s"] = time.perf_counter() - t_start
        add_stats(run["cells"], args.n_resamples, args.seed)
        if args.json:
            args.json.write_text(json.dumps(run, indent=1))
        if args.out:
            args.out.write_text(render(run))

    from dflash2.engine.kept import release_decode_state

    last_s = dict(PRIOR_S) if dev.type == "cuda" else {}
    bar = tqdm(plan, desc=f"throughput ({args.mode})", file=sys.stderr)
    for cell, go in bar:
        bar.set_postfix_str(f"batch {cell['batch']} {cell['arm']} N={cell['n']} p={cell['p']}")
        kind = cell["kind"]
        needs_ar = kind != "ar" and not any(c["kind"] == "ar" and c["batch"] == cell["batch"] and c["status"] == "ok"
                                            for c in run["cells"])
        if kind == "hf_compile" and dev.type != "cuda":
            cell["status"] = NA_CPU  # reduce-overhead = CUDA graphs
        elif time.perf_counter() - t_start + last_s.get(kind, 0.0) > args.budget_s:
            cell["status"] = NOT_RUN_BUDGET
        elif needs_ar:
            cell["status"] = NOT_RUN_NO_AR
        else:
            t0 = time.perf_counter()
            try:
                go(cell)
            except Exception as e:  # record and go on: one failing arm must not lose the others
                traceback.print_exc()
                cell["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            finally:
                release_decode_state(target)  # no arm runs on the state (and graphs) another one left
            last_s[kind] = time.perf_counter() - t0
            cell["cell_s"] = last_s[kind]
        if kind == "projection":  # the probe itself is no row; its projections are
            for proj in cell["projections"]:
                if cell["status"] != "ok" and proj["status"] == "ok":
                    proj["status"] = cell["status"]
            run["cells"] += cell.pop("projections")
            run.setdefault("draft_probes", []).append({"batch": cell["batch"], "n": cell["n"], "status": cell["status"],
                                                       "draft_ms": cell.get("draft_ms")})
        else:
            run["cells"].append(cell)
        save()
    save()
    if not args.out:
        print(render(run))
    return run


if __name__ == "__main__":
    main()
