"""`run_eval(cfg, run_dir)`: what `python eval/run.py ...` does (one process or one rank of an
`accelerate launch`), callable from Python and tests.

    output dir   refuse a non-empty one without resume=true (rank 0; the others use its path)
    runner       EvalRunner(cfg).run(): every missing (arm, sample) record of this process's
                 shard, appended to DIR/records.jsonl (DIR/shards/records.rank<r>.jsonl sharded)
    merge        sharded, or resumed from a sharded run: every record file into one records.jsonl
                 (sharding.merge_run_dir), on rank 0 after every rank finished
    finish       summary.json, report.html / report.md, the terminal table, W&B (runner.finish)
"""

from __future__ import annotations

import logging
from pathlib import Path

from dflash2.evaluation.running.runner import EvalRunner, finish
from dflash2.evaluation.running.sharding import init_shard, merge_run_dir, shard_files

log = logging.getLogger(__name__)


def run_eval(cfg, run_dir: str | Path, job_name: str | None = "eval") -> Path | None:
    """One evaluation on this process's shard (the body of `eval/run.py`).

    Args:
        cfg: the `EvalConfig`.
        run_dir: Hydra's run directory (= `output_dir`; rank 0's is used by every process, so a
            timestamped default resolved a second apart on two processes cannot split the run).
        job_name: Hydra's job name (its log file is not counted as a leftover of an earlier run).
    Returns:
        the run directory on the process that wrote the summary and report (rank 0), else None.
    """
    from dflash2.runconfig import prepare_output_dir

    shard = init_shard(cfg.hardware)
    if shard.world == 1:
        out = prepare_output_dir(run_dir, bool(cfg.resume), job_name=job_name)
        runner = EvalRunner(cfg, out, shard=shard)
        records = runner.run()
        if shard_files(out):  # resumed from a sharded run: fold its shard records in
            records = merge_run_dir(out, runner.sample_order(), [a.label for a in runner.arms])
        finish(cfg, out, records, runner)
        return out

    error, path = None, None
    if shard.main:
        try:
            path = str(prepare_output_dir(run_dir, bool(cfg.resume), job_name=job_name))
        except (OSError, ValueError) as e:  # FileExistsError / PermissionError: raise after telling the others
            error = e
    path = shard.broadcast(path)
    if path is None:
        if error is not None:
            raise error
        log.error("rank %d: rank 0 could not prepare output_dir=%s; exiting", shard.rank, run_dir)
        return None
    out = Path(path)
    if Path(run_dir).resolve() != out.resolve():
        log.warning("rank %d: output_dir resolved to %s here, using rank 0's %s", shard.rank, run_dir, out)
    runner = EvalRunner(cfg, out, shard=shard)
    runner.run()
    log.info("rank %d of %d: done", shard.rank, shard.world)
    shard.wait()  # every shard file is complete
    if not shard.main:
        return None
    records = merge_run_dir(out, runner.sample_order(), [a.label for a in runner.arms])
    finish(cfg, out, records, runner)
    return out
