"""Lossless speculative evaluation (DESIGN.md section 5): arms interleaved per prompt on GSM8K,
HumanEval and MT-Bench; records, statistics, a local report and W&B.

    python eval/run.py experiment=tiny_cpu output_dir=DIR                 # 2-core CPU, < 2 minutes
    python eval/run.py experiment=smollm2_gpu output_dir=DIR draft_path=CKPT
    python eval/run.py experiment=qwen3_8b output_dir=DIR draft_path=CKPT 'arms.num_speculative_tokens=[1,3,7,15]'
    python eval/run.py ... output_dir=DIR resume=true                     # continue a killed run
    python eval/run.py -m ... temperature=0,1 output_dir=DIR              # grid: one subdir per point
    accelerate launch --num_processes 2 eval/run.py ... output_dir=DIR    # sharded: one process per GPU

Writes DIR/.hydra/config.yaml (the resolved config), DIR/run.json, DIR/records.jsonl (one line
per arm and sample), DIR/summary.json, DIR/report.html and DIR/report.md, then prints a short
summary read back from summary.json (tau per arm, outputs identical to AR, accuracy, where the
report is); `resume=true` first says how many records it keeps. Every config value is checked
before any work, and so is what the draft checkpoint's `config.json` and safetensors headers and
the target's config tell (`dflash2.preflight`: N against the block, the files, the vocabulary,
the positions): a refused run writes nothing and exits with status 2 after one `error: ...`
line (`DFLASH2_DEBUG=1` adds the traceback; see `dflash2.entrypoint`). Under `-m`, every point of the sweep
is checked before Hydra creates the sweep directory (`dflash2.entrypoint.preflight_multirun`).

Sharded (`accelerate launch --num_processes K`, K GPUs; on CPU `--multi_gpu` starts K gloo
processes): item i goes to process i % K (both MT-Bench turns on one process), each process
runs its own warmup and timed arms and appends to DIR/shards/records.rank<r>.jsonl; process 0
merges them into the one DIR/records.jsonl and writes the one summary and report
(`dflash2/evaluation/running/sharding.py`, docs/MULTI_GPU.md "Sharded evaluation"). Resume with any K.
"""

import json
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from dflash2.entrypoint import run_entry, user_errors
from dflash2.evaluation.running.config import register_eval_schema

register_eval_schema()
log = logging.getLogger("eval")


def checked(cfg):
    """The `EvalConfig` of `cfg` after every check (raises `ConfigError`); touches no file."""
    from dflash2.entrypoint import checked_object
    from dflash2.evaluation.running.config import validate
    from dflash2.runconfig import check_shared_specs, existing_path

    def draft_exists(obj) -> None:
        if obj.draft_path is not None and not existing_path(obj.draft_path, directory=True):
            raise ValueError(f"draft_path={obj.draft_path}: no such checkpoint directory")

    from dflash2.preflight import check_eval_arms

    # The draft checkpoint and the arms last: from config.json and the safetensors headers, no weights.
    return checked_object(cfg, check_shared_specs, validate, draft_exists, check_eval_arms)


def eval_summary(out_dir: Path) -> str:
    """The end-of-run lines, from `DIR/summary.json`: per arm tau (pooled, bonus token included),
    outputs identical to the AR arm's, accuracy; then where the records and report are."""
    summary = json.loads((Path(out_dir) / "summary.json").read_text())
    lines = [f"evaluation finished: {summary.get('n_samples', '?')} samples ({', '.join(summary.get('datasets', []))})"]
    for arm in summary.get("arms", []):
        o = summary["per_arm"][arm]["overall"]
        parts = [f"  {arm:<24}"]
        if o.get("tau_pooled") is not None:
            parts.append(f"tau {o['tau_pooled']:.3f}")
        if o.get("identical_fraction") is not None:
            n = int(o.get("n", 0))
            parts.append(f"identical to AR {round(o['identical_fraction'] * n)}/{n}")
        if o.get("accuracy") is not None:
            parts.append(f"accuracy {o['accuracy']:.3f} ({o.get('n_scored', '?')} scored)")
        lines.append("  ".join(parts))
    out = Path(out_dir)
    lines += [f"  records: {out / 'records.jsonl'}", f"  summary: {out / 'summary.json'}",
              f"  report:  {out / 'report.html'}"]
    return "\n".join(lines)


@hydra.main(config_path="../configs/eval", config_name="eval", version_base=None)
@user_errors
def main(cfg) -> None:
    from dflash2.entrypoint import is_main_process, resume_note, write_run_config
    from dflash2.evaluation.running.run import run_eval
    from dflash2.runconfig import check_output_dir, prepare_output_dir

    obj = checked(cfg)
    hc = HydraConfig.get()
    # Run mode: output_dir itself (Hydra's run dir is `.`, so it creates nothing). Multirun:
    # each grid point gets its own subdir of the sweep directory.
    run_dir = hc.runtime.output_dir if hc.mode == RunMode.MULTIRUN else obj.output_dir
    check_output_dir(run_dir, bool(obj.resume), job_name=hc.job.name)   # every process, before any writes
    if is_main_process():   # rank 0 prepares the directory; run_eval's own check then passes
        if obj.resume:
            print(resume_note("eval", run_dir, ("records.jsonl", "shards/*.jsonl")), flush=True)
        write_run_config(prepare_output_dir(run_dir, bool(obj.resume), job_name=hc.job.name), cfg, job_name=hc.job.name)
    out = run_eval(cfg, run_dir, job_name=hc.job.name)
    if out is None:  # a sharded run's other processes: rank 0 merges and reports
        return
    print(eval_summary(out), flush=True)


if __name__ == "__main__":
    run_entry(main, config_dir=Path(__file__).resolve().parent.parent / "configs/eval", config_name="eval",
              check=checked)
