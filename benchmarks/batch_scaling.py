"""Step cost against batch size: exact mode's invariant kernels beside the normal engine.

    python -m benchmarks.batch_scaling                                   # qwen2.5-0.5b shape, batch 64, 256, 512
    python -m benchmarks.batch_scaling --shape smollm2-135m --batch 8,64 --new-tokens 32
    OUT=/tmp/out python -m benchmarks.batch_scaling                      # also $OUT/batch_scaling.{md,json}

Per batch size B, four arms of `speculative_generate` on the shape's random bf16 target with a
random DFlash2 draft (selector rank 64): AR and N = 7 at T = 0 in exact mode
(`exact_impl="invariant"`, every forward padded to the draft's block of 16), and AR and N = 7 at T
= 1 on the normal engine. The draft has the shape's layer count (two at the 0.5B shape). Prompts
are B random token rows of 100-399 tokens (`--prompt-tokens 100,400`: lengths spread over [MIN,
MAX), one fixed draw); `--new-tokens` tokens each. Each arm runs one untimed call (graph capture,
kernel selection) and then one timed whole call, the device synchronized before and after it;
ms/step = wall / steps of the longest row; `prefill_s` is the call's prefill
(`SpeculativeOutput.times.prefill`: the prompts' forwards up to the first token,
which ends on a host read of the first logits), and `ms_decode` = (wall - prefill) / steps, the
steps alone. The random draft accepts almost nothing, so steps ~= new tokens for every arm and
`ms_decode` is the cost of one step at that batch. Rows: `B, arm, wall_s, prefill_s, steps,
ms_step, ms_decode, peak_gib` (`torch.cuda.max_memory_allocated` since the process started, so
it never decreases). The exact arms need CUDA (or
`TRITON_INTERPRET=1` on a CPU, for tests); without either they report the engine's refusal as their
`error`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.engine import SHAPES
from dflash2.runconfig import DraftSpec, new_draft, random_target_config

PROMPT_TOKENS = (100, 400)  # the default span of prompt lengths, [MIN, MAX)
ARMS = (("ar_exact", 0, 0.0, True), ("n7_exact", 7, 0.0, True), ("ar_t1", 0, 1.0, False), ("n7_t1", 7, 1.0, False))


def _ints(text: str) -> list[int]:
    vals = [int(x) for x in text.split(",") if x.strip()]
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated positive integers, e.g. 64,256")
    return vals


def build(shape: str, device: torch.device):
    """(target, draft) of `shape` (`benchmarks.engine.SHAPES`), random weights, seed 0."""
    from transformers import AutoModelForCausalLM

    from dflash2.target import TargetModel

    spec, layers = SHAPES[shape]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    target = TargetModel(AutoModelForCausalLM.from_config(random_target_config(spec), dtype=dtype).to(device).eval())
    draft = new_draft(DraftSpec(name="bench", num_hidden_layers=layers, selector_rank=64), target)
    return target, draft.to(device=device, dtype=dtype).eval()


def measure(target, draft, batch: int, new_tokens: int, device: torch.device,
            prompt_tokens: tuple[int, int] = PROMPT_TOKENS) -> list[dict]:
    """The four arms' rows at batch `batch`; prompt `i` has `lo + (37 i) mod (hi - lo)` tokens for
    `prompt_tokens` = (lo, hi) (module docstring)."""
    from dflash2.engine import speculative_generate

    g = torch.Generator().manual_seed(batch)
    vocab = int(target.vocab_size)
    lo, hi = prompt_tokens
    prompts = [torch.randint(0, vocab - 1, (lo + (i * 37) % (hi - lo),), generator=g).tolist() for i in range(batch)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for name, n, temp, exact in ARMS:
        kw = dict(exact=True, exact_block_size=int(draft.block_size), exact_impl="invariant") if exact else {}
        call = dict(max_new_tokens=new_tokens, num_speculative_tokens=n or None, temperature=temp,
                    seed=list(range(batch)), **kw)
        d = draft if n else None
        try:
            speculative_generate(target, d, prompts, **call)          # untimed: graphs, kernel selection
            sync()
            t0 = time.perf_counter()
            out = speculative_generate(target, d, prompts, **call)
            sync()
            wall = time.perf_counter() - t0
            steps = max(len(a) for a in out.accepted)
            prefill = min(out.times.prefill, wall)
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
            rows.append(dict(B=batch, arm=name, wall_s=round(wall, 3), prefill_s=round(prefill, 3), steps=steps,
                             ms_step=round(1000 * wall / steps, 2), ms_decode=round(1000 * (wall - prefill) / steps, 2),
                             peak_gib=None if peak is None else round(peak, 1)))
        except Exception as e:  # noqa: BLE001  (a refused or failed arm is a row, not the end of the run)
            rows.append(dict(B=batch, arm=name, error=f"{type(e).__name__}: {e}"[:300]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict], title: str) -> str:
    """The rows as a table, with exact / normal per batch (the same N and T = 0 vs T = 1), for the
    whole call per step and for the steps alone."""
    by = {(r["B"], r["arm"]): r for r in rows}
    lines = [title, "", "| batch | arm | ms/step, whole call | prefill s | ms/step, steps alone | steps | peak GiB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ms_step" in r:
            cells = f"{r['ms_step']:.2f} | {r['prefill_s']:.3f} | {r['ms_decode']:.2f}"
        else:
            cells = f"error: {r['error']} | - | -"
        lines.append(f"| {r['B']} | {r['arm']} | {cells} | {r.get('steps', '-')} | {r.get('peak_gib', '-')} |")
    lines += ["", "| batch | exact / normal, AR | exact / normal, N = 7 | steps alone: AR | steps alone: N = 7 |",
              "|---|---|---|---|---|"]
    for b in sorted({r["B"] for r in rows}):
        ratio = []
        for key in ("ms_step", "ms_decode"):
            for e, o in (("ar_exact", "ar_t1"), ("n7_exact", "n7_t1")):
                x, y = by.get((b, e), {}), by.get((b, o), {})
                ok = key in x and key in y and y[key] > 0
                ratio.append(f"{x[key] / y[key]:.1f}x" if ok else "-")
        lines.append(f"| {b} | " + " | ".join(ratio) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch_scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--batch", type=_ints, default=[64, 256, 512])
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--prompt-tokens", type=_ints, default=list(PROMPT_TOKENS),
                   help="MIN,MAX: prompt lengths in [MIN, MAX)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    args = p.parse_args(argv)
    if args.new_tokens < 2:
        print("error: --new-tokens must be >= 2", file=sys.stderr)
        return 2
    if len(args.prompt_tokens) != 2 or args.prompt_tokens[0] >= args.prompt_tokens[1]:
        print(f"error: --prompt-tokens must be MIN,MAX with MIN < MAX, got {args.prompt_tokens}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    target, draft = build(args.shape, device)
    span = tuple(args.prompt_tokens)
    rows = [r for b in args.batch for r in measure(target, draft, b, args.new_tokens, device, span)]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    layers = SHAPES[args.shape][1]
    text = markdown(rows, f"Step cost against batch, {name}: {args.shape} random target, random {layers}-layer "
                          f"draft, prompts of {span[0]}-{span[1] - 1} tokens, {args.new_tokens} new tokens; "
                          f"exact = invariant kernels at width {draft.block_size}")
    print(text)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        (out / "batch_scaling.md").write_text(text)
        (out / "batch_scaling.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
