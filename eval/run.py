"""Lossless speculative evaluation (DESIGN.md section 5): arms interleaved per prompt on GSM8K,
HumanEval and MT-Bench; records, statistics, a local report and W&B.

    python eval/run.py experiment=tiny_cpu output_dir=DIR                 # 2-core CPU, < 2 minutes
    python eval/run.py experiment=smollm2_gpu output_dir=DIR draft_path=CKPT
    python eval/run.py experiment=qwen3_8b output_dir=DIR draft_path=CKPT 'arms.num_speculative_tokens=[1,3,7,15]'
    python eval/run.py ... output_dir=DIR resume=true                     # continue a killed run
    python eval/run.py -m ... temperature=0,1 output_dir=DIR              # grid: one subdir per point
    accelerate launch --num_processes 2 eval/run.py ... output_dir=DIR    # sharded: one process per GPU

Writes DIR/run.json, DIR/records.jsonl (one line per arm and sample), DIR/summary.json,
DIR/report.html and DIR/report.md.

Sharded (`accelerate launch --num_processes K`, K GPUs; on CPU `--multi_gpu` starts K gloo
processes): item i goes to process i % K (both MT-Bench turns on one process), each process
runs its own warmup and timed arms and appends to DIR/shards/records.rank<r>.jsonl; process 0
merges them into the one DIR/records.jsonl and writes the one summary and report
(`dflash2/evaluation/sharding.py`, docs/MULTI_GPU.md "Sharded evaluation"). Resume with any K.
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
    from dflash2.evaluation.run import run_eval

    hc = HydraConfig.get()
    # Run mode: hydra.run.dir = output_dir. Multirun: each grid point gets its own subdir.
    out = run_eval(cfg, hc.runtime.output_dir, job_name=hc.job.name)
    if out is None:  # a sharded run's other processes: rank 0 merges and reports
        return
    print(f"records: {out / 'records.jsonl'}\nsummary: {out / 'summary.json'}\nreport:  {out / 'report.html'}")


if __name__ == "__main__":
    main()
