"""Prompt-length benchmark: what a prompt of a length the process has not seen costs, against
one it has seen.

    python -m benchmarks.prompt_lengths --shape smollm2-135m --out lengths.md --json lengths.json

(from the repository root). The model has random weights at `--shape`, with the random draft of
`benchmarks.engine`. In each mode (`normal`; `exact`: its default kernels, the invariant ones
on CUDA), an untimed first call per arm pays the mode's one-time costs: its state, graphs and
compiles. Then, for each arm (AR, then DFlash2 at `--n`), one call runs per prompt length of
`--lengths`, all new to the process: each (mode, arm) shifts the lengths by `LENGTH_SHIFT` past
the previous one's. A second pass repeats the same lengths, now seen. Each call is one
`speculative_generate` of one row and `--new-tokens` tokens, at the engine's defaults. We
record three things per call:
- its prefill (`StepTimes.prefill`, ms);
- its wall clock (the device synchronized before and after);
- how many Triton binaries dflash2's kernels compiled during it, and which kernels
  (`triton_binaries`).

Each row of the table is a (mode, arm, pass) with the medians over the lengths. "new / seen" is
the ratio of the two passes' medians. Near 1 means a new length costs nothing extra.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.engine import SHAPES, build_models
from benchmarks.floors import sync
from dflash2.engine import speculative_generate
from dflash2.kernels.dispatch import triton_binaries

MODES = {"normal": {}, "exact": {"exact": True, "exact_impl": "auto"}}  # exact: the invariant kernels on CUDA
LENGTH_SHIFT = 128  # prompt tokens between the length ranges of successive (mode, arm) cells


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 301,302") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def lengths_arg(text: str) -> list[int]:
    """`A-B` (inclusive) or a comma list: the prompt lengths, each used once per pass."""
    if "-" in text:
        a, _, b = text.partition("-")
        lo, hi = _ints(a)[0], _ints(b)[0]
        if hi < lo:
            raise argparse.ArgumentTypeError(f"{text!r}: the range ends before it starts")
        return list(range(lo, hi + 1))
    return _ints(text)


def one_call(target, draft, n: int, prompt: torch.Tensor, new_tokens: int, mode: dict, device) -> dict:
    """One timed call: {"prefill_ms", "wall_ms", "compiled"} (Triton binaries it compiled, and
    "kernels": {kernel name: binaries} of those)."""
    before = triton_binaries(per_kernel=True)
    sync(device)
    t0 = time.perf_counter()
    out = speculative_generate(target, draft, [prompt], max_new_tokens=new_tokens, num_speculative_tokens=n,
                               **mode)
    sync(device)
    wall = time.perf_counter() - t0
    after = triton_binaries(per_kernel=True)
    grown = {k.rsplit(".", 1)[-1]: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return {"prefill_ms": 1e3 * float(out.times.prefill), "wall_ms": 1e3 * wall,
            "compiled": sum(grown.values()), "kernels": grown}


def summarize(calls: list[dict]) -> dict:
    """Medians of a pass's calls and the binaries compiled over all of them, per kernel."""
    kernels: dict[str, int] = {}
    for c in calls:
        for name, n in c["kernels"].items():
            kernels[name] = kernels.get(name, 0) + n
    return {"calls": len(calls), "prefill_ms": statistics.median(c["prefill_ms"] for c in calls),
            "wall_ms": statistics.median(c["wall_ms"] for c in calls),
            "compiled": sum(c["compiled"] for c in calls), "kernels": kernels}


def render(run: dict) -> str:
    m = run["meta"]
    lines = [f"# Prompt lengths: new against seen ({m['device_name']}, {m['shape']})", "",
             f"`{m['command']}`", "",
             f"{len(m['lengths'])} lengths per pass (each row's range below), "
             f"{m['new_tokens']} new tokens, batch 1; torch {m['torch']}.", "",
             "| mode | arm | lengths | prefill ms new | prefill ms seen | new / seen | call ms new | call ms seen "
             "| new / seen | binaries compiled new | seen | kernels that compiled (new pass) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in run["rows"]:
        new, seen = r["new"], r["seen"]
        lines.append(f"| {r['mode']} | {r['arm']} | {r['lengths'][0]}-{r['lengths'][1]} | {new['prefill_ms']:.2f} | "
                     f"{seen['prefill_ms']:.2f} | "
                     f"{new['prefill_ms'] / seen['prefill_ms']:.2f} | {new['wall_ms']:.1f} | {seen['wall_ms']:.1f} | "
                     f"{new['wall_ms'] / seen['wall_ms']:.2f} | {new['compiled']} | {seen['compiled']} | "
                     f"{', '.join(f'{k} x{v}' for k, v in sorted(new['kernels'].items())) or '-'} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prompt_lengths", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--lengths", type=lengths_arg, default=lengths_arg("301-316"),
                   help="prompt lengths, A-B or a comma list (default 301-316)")
    p.add_argument("--n", type=int, default=3, help="DFlash2's speculative tokens")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--modes", default="normal,exact", help=f"subset of {','.join(MODES)}")
    p.add_argument("--out", type=Path, help="Markdown file")
    p.add_argument("--json", type=Path, help="raw numbers (JSON)")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        p.error(f"--modes {args.modes!r}: use a comma list of {', '.join(MODES)}")
    args.modes = modes
    if args.n < 1 or args.new_tokens < 2:
        p.error("--n must be >= 1 and --new-tokens >= 2")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible")
    return args


def main(argv: list[str] | None = None) -> dict:
    import transformers
    from tqdm import tqdm

    args = parse_args(argv)
    dev = args.device
    target, draft = build_models(args.shape, dev)
    vocab = target.vocab_size
    gen = torch.Generator().manual_seed(0)
    run = {"meta": {"command": "python -m benchmarks.prompt_lengths " + shlex.join(argv if argv is not None
                                                                                  else sys.argv[1:]),
                    "shape": args.shape, "lengths": args.lengths, "new_tokens": args.new_tokens, "n": args.n,
                    "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU",
                    "torch": torch.__version__, "transformers": transformers.__version__},
           "rows": []}
    arms = [("ar", None, 0), (f"dflash2@N={args.n}", draft, args.n)]
    bar = tqdm(total=len(args.modes) * len(arms) * 2 * len(args.lengths), desc="calls", file=sys.stderr)
    cell = 0
    width = int(draft.block_size)  # exact mode: every arm at the draft's padded width
    for mode in args.modes:
        kw = {**MODES[mode], "exact_block_size": width} if MODES[mode] else {}
        first = torch.randint(0, vocab - 1, (40,), generator=gen).to(dev)
        for _, d, n in arms:  # untimed: the mode's states, graphs and compiles
            one_call(target, d, n, first, args.new_tokens, kw, dev)
        for label, d, n in arms:
            # Each (mode, arm) runs lengths no earlier cell ran (shifted by LENGTH_SHIFT per cell), so its
            # first pass is new to the whole process, not only to this arm.
            lengths = [x + LENGTH_SHIFT * cell for x in args.lengths]
            cell += 1
            prompts = {x: torch.randint(0, vocab - 1, (x,), generator=gen).to(dev) for x in lengths}
            passes = {}
            for name in ("new", "seen"):
                calls = []
                for length in lengths:
                    calls.append(one_call(target, d, n, prompts[length], args.new_tokens, kw, dev))
                    bar.update(1)
                passes[name] = summarize(calls)
            run["rows"].append({"mode": mode, "arm": label, "lengths": [lengths[0], lengths[-1]], **passes})
            print(f"{mode} {label}: prefill new {passes['new']['prefill_ms']:.2f} ms, seen "
                  f"{passes['seen']['prefill_ms']:.2f} ms; binaries compiled {passes['new']['compiled']} / "
                  f"{passes['seen']['compiled']}", file=sys.stderr)
    bar.close()
    if args.json:
        args.json.write_text(json.dumps(run, indent=1))
    if args.out:
        args.out.write_text(render(run))
    print(render(run))
    return run


if __name__ == "__main__":
    main()
