"""Out-of-sample validation of the cost model (`dflash2.evaluation.analysis.cost`, issue 7 item 5) on one GPU.

    OUT=/tmp/out python -m benchmarks.cost_model                      # Qwen3-8B-shaped random target
    OUT=... python -m benchmarks.cost_model --gguf path/SmolLM2-135M-Instruct.Q4_1.gguf   # real model

Protocol (greedy, batch 1 by default, `speculative_generate(timing=True)`; on CUDA the engine's
CUDA-graph step by default, `--engine eager` for the eager loop):
1. calibrate: prompts of 512 tokens; the AR baseline and the oracle proposer
   (`dflash2/evaluation/arms/oracle_proposers.py`: each slot proposes the AR token with probability p) at
   N in {1, 3, 7, 15}; every decoding step is timed at its committed context (512..512+G);
   per N and 32-token context bin the median step time is one `StepCost`; fit `StepCostModel`;
   the acceptance profile is pooled over the calibration runs (`AcceptanceProfile.pooled`).
2. predict tokens/s at N in {2, 5, 10} (and AR) at prompts of 2048 tokens: new N values, a
   context 2.7x beyond the calibrated one.
3. measure those runs and print/write `$OUT/cost_model.md`: predicted vs measured tokens/s and
   % error (target: within 10%), also with each run's own measured tau (isolating the step-cost
   part of the error), and the speedups.

Tokens/s are steady-state: over steps where every row is decoding and none is on its last
(possibly truncated) step: tokens committed / time of those steps. Eager loop: a step's time is
its draft + select + verify readings plus an equal share of the loop's unmeasured remainder.
Graph engine: a step's time is its whole-step reading (replay + the report copy), and the steps
that were not replays (the first, and each K/V bucket's warm-up + capture) are left out. The
oracle is then `DeviceOracleProposer` (same law, coins on the device), which runs inside the
graph; in the eager loop it is `OracleProposer`, timed around its own call.

Random target: Qwen3-8B shapes (hidden 4096, 32/8 heads, MLP 12288, vocab 151936) with fewer
layers (`--layers`, default 8), bf16. Its attention-output and MLP-down projections are scaled
by 1e-4 and its LM head is a copy of the embedding, so the residual stream stays close to the
current token's embedding and greedy decoding repeats the last token with a top-1/top-2 logit
gap of tens of logits: the oracle's references (the AR tokens) never depart from the verifier
under bf16 numerics, so acceptance is set by the oracle's coins alone. The cost is that of
dense bf16 layers of those shapes (the values do not change dense kernel times).
Needs torch + transformers only (+ `gguf` with --gguf). About 1-2 minutes on an H200.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch


from dflash2.engine import speculative_generate
from dflash2.engine.compiled import COMPILE_LEVELS
from dflash2.evaluation.analysis.cost import AcceptanceProfile, StepCost, StepCostModel, predict_speedup
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer, OracleProposer
from dflash2.target import TargetModel


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_target(layers: int, device: torch.device, smoke: bool = False,
                 gguf: str | None = None) -> tuple[TargetModel, str]:
    if gguf and not smoke:
        tgt = TargetModel.from_pretrained(gguf, dtype=torch.bfloat16, device=device)
        return tgt, f"GGUF {Path(gguf).name} (bf16, {tgt.num_layers} layers)"
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shape = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128)
    if smoke:  # CPU check of this script's logic only
        shape = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16)
    cfg = Qwen3Config(**shape, num_hidden_layers=layers, max_position_embeddings=40960, rope_theta=1e6,
                      tie_word_embeddings=False)
    dtype = torch.float32 if smoke else torch.bfloat16
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg).to(dtype).eval()
    finally:
        torch.set_default_dtype(prev)
    with torch.no_grad():  # see the module docstring: a robust greedy path at unchanged cost
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(1e-4)
            layer.mlp.down_proj.weight.mul_(1e-4)
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    return TargetModel(model), ("SMOKE tiny fp32 CPU model" if smoke else
                                f"random Qwen3-8B-shaped, {layers} layers, bf16")


class TimedOracle:
    """OracleProposer whose proposal time is measured (synchronized) and reported as draft time."""

    def __init__(self, inner: OracleProposer, device: torch.device):
        self.inner, self.block_size, self.target_layer_ids = inner, inner.block_size, inner.target_layer_ids
        self.device = device

    def propose(self, step):
        sync(self.device)
        t0 = time.perf_counter()
        p = self.inner.propose(step)
        sync(self.device)
        p.draft_s = time.perf_counter() - t0
        return p


def steady_steps(out, n: int) -> list[dict]:
    """Per decoding step of the steady part of a run: seconds, mean committed context, tokens."""
    t = out.times
    steps = len(t.verify)
    if t.replayed:  # graph engine: `verify` holds each whole step; keep the replays only
        phases, rest, keep = list(t.verify), 0.0, t.replayed
    else:
        phases = [t.verify[k] + (t.draft[k] if t.draft else 0.0) + (t.select[k] if t.select else 0.0)
                  for k in range(steps)]
        rest = max(t.total - t.prefill - sum(phases), 0.0) / max(steps, 1)  # host work between readings
        keep = [True] * steps
    starts = [np.concatenate([[p], p + np.cumsum(np.asarray(a) + 1)]) for p, a in zip(out.prompt_lengths,
                                                                                      out.accepted)]
    last = min(len(a) for a in out.accepted) - 1  # every row decoding, none on its final step
    return [{"s": phases[k] + rest, "ctx": float(np.mean([s[k] for s in starts])),
             "tokens": int(sum(a[k] + 1 for a in out.accepted)), "n": n} for k in range(last) if keep[k]]


def generate(target, prompts, n, refs, seeds, args):
    graphs = args.engine == "graphs"
    draft = None
    if n > 0:
        kw = dict(block_size=16, accept_prob=args.accept_prob, vocab_size=target.vocab_size)
        draft = (DeviceOracleProposer(refs, seeds, device=target.device, **kw) if graphs else
                 TimedOracle(OracleProposer(refs, seeds, **kw), target.device))
    level = None if args.compile_level == "none" or not graphs else args.compile_level
    return speculative_generate(target, draft, prompts, max_new_tokens=args.gen, num_speculative_tokens=n,
                                temperature=0.0, timing=True, graphs=graphs, compile_level=level)


def measure(target, ctx: int, ns: list[int], args, rng: np.random.Generator) -> dict:
    """{N: {"steps": [...], "accepted": [...], "identical": bool}} over `args.repeats` prompt sets."""
    res: dict[int, dict] = {n: {"steps": [], "accepted": [], "identical": True} for n in [0] + ns}
    for r in range(args.repeats):
        prompts = [rng.integers(100, target.vocab_size - 100, size=ctx).tolist() for _ in range(args.batch)]
        ar = generate(target, prompts, 0, None, None, args)
        res[0]["steps"] += steady_steps(ar, 0)
        refs = [s.tolist() for s in ar.sequences]
        seeds = [1000 * r + b + 7919 * ctx for b in range(args.batch)]
        for n in ns:
            out = generate(target, prompts, n, refs, seeds, args)
            res[n]["steps"] += steady_steps(out, n)
            res[n]["accepted"] += out.accepted
            res[n]["identical"] &= all(s.tolist() == ref for s, ref in zip(out.sequences, refs))
        print(f"  ctx {ctx}: repeat {r + 1}/{args.repeats} done", flush=True)
    return res


def binned(res: dict, batch: int, width: int = 32) -> list[StepCost]:
    """Per N and context bin of `width` tokens: the median step time (robust to the odd slow
    step: a GC pause, a clock change), weighted by the bin's step count."""
    out = []
    for n, r in res.items():
        bins: dict[int, list[dict]] = {}
        for s in r["steps"]:
            bins.setdefault(int(s["ctx"] // width), []).append(s)
        out += [StepCost(batch, n, float(np.mean([s["ctx"] for s in b])), float(np.median([s["s"] for s in b])),
                         weight=len(b)) for b in bins.values()]
    return out


def tokens_per_s(steps: list[dict]) -> float:
    return sum(s["tokens"] for s in steps) / sum(s["s"] for s in steps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8, help="layers of the random target (default 8)")
    ap.add_argument("--gguf", default=None, help="a real GGUF target instead of the random Qwen3-8B-shaped one")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--gen", type=int, default=256, help="new tokens per run (default 256)")
    ap.add_argument("--accept-prob", type=float, default=0.8, help="oracle per-slot probability (default 0.8)")
    ap.add_argument("--calib-ctx", type=int, default=512)
    ap.add_argument("--calib-n", default="1,3,7,15")
    ap.add_argument("--valid-ctx", type=int, default=2048)
    ap.add_argument("--valid-n", default="2,5,10")
    ap.add_argument("--repeats", type=int, default=8, help="prompt sets per (ctx, N) (default 8)")
    ap.add_argument("--tolerance", type=float, default=0.10, help="pass if |tokens/s error| <= this")
    ap.add_argument("--engine", choices=["graphs", "eager"], default=None,
                    help="the engine's CUDA-graph step (default on CUDA) or the eager loop (default on CPU)")
    ap.add_argument("--compile-level", choices=["none", *COMPILE_LEVELS], default="light",
                    help="the graph engine's compile_level (dflash2.engine.compiled; default light)")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU model: checks the script runs, measures nothing")
    args = ap.parse_args(argv)
    args.engine = args.engine or ("eager" if args.smoke else "graphs")
    if args.smoke and args.engine == "graphs":
        raise SystemExit("--engine graphs needs CUDA; --smoke runs on CPU with --engine eager")
    if args.smoke:
        args.calib_ctx, args.valid_ctx, args.gen, args.repeats, args.layers = 48, 128, 48, 1, 2
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks.cost_model needs a CUDA GPU (it measures GPU step costs); --smoke runs on CPU")
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    calib_n = [int(x) for x in args.calib_n.split(",")]
    valid_n = [int(x) for x in args.valid_n.split(",")]
    if max(calib_n + valid_n) > 15:
        raise SystemExit("N must be <= 15 (the oracle advertises block_size 16)")
    device = torch.device("cpu" if args.smoke else "cuda")
    gpu = "CPU" if args.smoke else torch.cuda.get_device_name(device)
    t_start = time.time()
    target, desc = build_target(args.layers, device, smoke=args.smoke, gguf=args.gguf)
    print(f"target: {desc}; {gpu}", flush=True)
    rng = np.random.default_rng(0)

    # Warm-up (untimed): kernels, allocator and cuBLAS heuristics for every shape used.
    warm = argparse.Namespace(**{**vars(args), "gen": 8, "repeats": 1})
    for ctx in (args.calib_ctx, args.valid_ctx):
        measure(target, ctx, sorted(set(calib_n + valid_n)), warm, rng)

    print("calibration ...", flush=True)
    cal = measure(target, args.calib_ctx, calib_n, args, rng)
    model = StepCostModel.fit(binned(cal, args.batch))
    # The oracle's slot acceptance does not depend on N: pool every calibration run (more steps
    # per position than the N = 15 runs alone; the profile's sampling error enters E(N) directly).
    profile = AcceptanceProfile.pooled({n: cal[n]["accepted"] for n in calib_n},
                                       source=f"oracle, pooled over calibration N {calib_n} at ctx {args.calib_ctx}")
    print("validation ...", flush=True)
    val = measure(target, args.valid_ctx, valid_n, args, rng)

    ctx_v = args.valid_ctx + args.gen / 2  # mean committed context of a validation run (a priori)
    fit = model.fits[args.batch]
    lines = [f"# Cost model validation (out-of-sample): {desc}, {gpu}", "",
             f"Calibrated on AR + oracle N in {calib_n} at prompt {args.calib_ctx} (contexts "
             f"{fit.ctx_range[0]:.0f}..{fit.ctx_range[1]:.0f}); predicted N in {valid_n} and AR at prompt "
             f"{args.valid_ctx} (mean context {ctx_v:.0f}). Engine: {args.engine}. Batch {args.batch}, "
             f"{args.gen} new tokens, "
             f"{args.repeats} prompt sets, oracle p = {args.accept_prob}, greedy.", "",
             f"Step-cost fit `{model.info()['formula']}`: " + ", ".join(f"{k} = {v:.4g}" for k, v in
                                                                         fit.coef.items() if k not in fit.dropped)
             + f"; dropped: {fit.dropped or 'none'}; {fit.n_points} (N, context) bins, weighted RMS relative residual "
               f"{fit.rms_rel_residual:.2%} (max {fit.max_rel_residual:.1%}).", "",
             f"Acceptance profile ({profile.source}), conditional a_i: "
             + ", ".join(f"{a:.3f}" for a in profile.conditional), "",
             "| N | pred step ms | meas step ms | pred tau | meas tau | pred tok/s | meas tok/s | error | "
             "pred tok/s (meas tau) | error | pred speedup | meas speedup | identical to AR |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ar_tps = tokens_per_s(val[0]["steps"])
    worst = 0.0
    for n in [0] + valid_n:
        st = val[n]["steps"]
        p = predict_speedup(model, profile, args.batch, n, ctx_v)
        meas_tps = tokens_per_s(st)
        meas_step = float(np.mean([s["s"] for s in st]))
        meas_tau = sum(s["tokens"] for s in st) / (len(st) * args.batch)
        own = args.batch * meas_tau / p.step_s
        err, err_own = p.tokens_per_s / meas_tps - 1, own / meas_tps - 1
        if n:
            worst = max(worst, abs(err))
        lines.append(f"| {n if n else 'AR'} | {1e3 * p.step_s:.3f} | {1e3 * meas_step:.3f} | "
                     f"{p.expected_tokens_per_step:.3f} | {meas_tau:.3f} | {p.tokens_per_s:.1f} | {meas_tps:.1f} | "
                     f"{100 * err:+.1f}% | {own:.1f} | {100 * err_own:+.1f}% | {p.speedup:.3f} | "
                     f"{meas_tps / ar_tps:.3f} | {'-' if not n else val[n]['identical']} |")
        for w in p.warnings:
            print(f"  note N={n}: {w}")
    verdict = "PASS" if worst <= args.tolerance else "FAIL"
    lines += ["", f"**{verdict}**: worst |tokens/s error| over N in {valid_n} = {100 * worst:.1f}% "
              f"(target <= {100 * args.tolerance:.0f}%). Total script time {time.time() - t_start:.0f} s.", "",
              "In-sample check (calibration runs, ctx " + str(args.calib_ctx) + "): " + ", ".join(
                  f"N={n} fit "
                  f"{1e3 * model.predict(args.batch, n, float(np.mean([s['ctx'] for s in cal[n]['steps']]))):.3f}"
                  f" / meas {1e3 * float(np.mean([s['s'] for s in cal[n]['steps']])):.3f} ms"
                  for n in [0] + calib_n)]
    text = "\n".join(lines) + "\n"
    print(text)
    (out_dir / "cost_model.md").write_text(text)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
