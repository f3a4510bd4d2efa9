"""Lossless speculative evaluation (DESIGN.md section 5): arms interleaved per prompt on GSM8K,
HumanEval and MT-Bench; records, statistics, a local report and W&B.

    python eval/run.py experiment=tiny_cpu output_dir=DIR                 # 2-core CPU, < 2 minutes
    python eval/run.py experiment=smollm2_gpu output_dir=DIR draft_path=CKPT
    python eval/run.py experiment=qwen3_8b output_dir=DIR draft_path=CKPT 'arms.num_speculative_tokens=[1,3,7,15]'
    python eval/run.py ... output_dir=DIR resume=true                     # continue a killed run
    python eval/run.py -m ... temperature=0,1 output_dir=DIR              # grid: one subdir per point

Writes DIR/run.json, DIR/records.jsonl (one line per arm and sample), DIR/summary.json,
DIR/report.html and DIR/report.md.
"""

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a fresh clone without install

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402

from dflash2.evaluation.config import register_eval_schema  # noqa: E402

register_eval_schema()
log = logging.getLogger("eval")


@hydra.main(config_path="../configs/eval", config_name="eval", version_base=None)
def main(cfg) -> None:
    from dflash2.evaluation.runner import EvalRunner, finish
    from dflash2.runconfig import prepare_output_dir

    hc = HydraConfig.get()
    # Run mode: hydra.run.dir = output_dir. Multirun: each grid point gets its own subdir.
    out = prepare_output_dir(hc.runtime.output_dir, bool(cfg.resume), job_name=hc.job.name)
    runner = EvalRunner(cfg, out)
    records = runner.run()
    finish(cfg, out, records, runner)
    print(f"records: {out / 'records.jsonl'}\nsummary: {out / 'summary.json'}\nreport:  {out / 'report.html'}")


if __name__ == "__main__":
    main()
