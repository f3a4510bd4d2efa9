"""Metric sinks of a distillation run: `DIR/metrics.jsonl` (one row per log step), W&B
(online / offline / disabled per `LoggerSpec`), and the console progress bar.

Logged names (all tau figures include the bonus token and are pooled over blocks):
    loss, loss_unary, loss_selector      the objective and its parts (spec 6.3)
    acc_pos_i, full_acc, eal              argmax agreement with the teacher per slot i (spec 3.7)
    tau_proxy                             1 + leading run of unary-argmax hits per block (simulated tau)
    recall_at_k, oracle_tau               y in unary top-K; 1 + leading run of such slots (the ceiling)
    target_mass_at_k                      teacher mass on the top-K (KL only)
    tf_selector_acc                       selector pick (teacher-forced predecessor, original top-K) == y,
                                          over all valid slots
    path_tau                              1 + leading run of the greedy self-conditioned selector walk
    lr, grad_norm, samples_per_s, tokens_per_s, peak_mem_gb
    eval/tau_real, eval/tau_proxy, eval/gap   every eval_every steps: the real engine on held-out prompts
"""

from __future__ import annotations

import secrets
from pathlib import Path

from dflash2 import killpoints
from dflash2.jsonl import append_jsonl, read_jsonl, repair_jsonl, rewrite_jsonl


class MetricsJsonl:
    """Append-only `metrics.jsonl`, through the product's one JSONL rule (`dflash2.jsonl`).

    Each row is appended, flushed and fsynced (`append_jsonl`); non-finite floats are written as
    null. On resume from step `resume_step` (0 when no checkpoint was usable) the file is first
    repaired (a torn last line, left by a kill mid-write, is dropped with a warning) and the rows
    after that step are dropped (`rewrite_jsonl`, atomic), so a killed-and-resumed run has exactly
    one row per step and keeps every row of the steps it resumed from.
    """

    def __init__(self, path: Path, resume_step: int | None):
        self.path = Path(path)
        if resume_step is not None and self.path.is_file():
            rows = repair_jsonl(self.path)
            keep = [r for r in rows if r.get("step", 0) <= resume_step]
            if len(keep) != len(rows):
                rewrite_jsonl(self.path, keep)

    def write(self, row: dict) -> None:
        killpoints.reached("metrics_write", int(row.get("step", 0)), torn_file=self.path, row=row)
        append_jsonl(self.path, [row])


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a `metrics.jsonl` (reading only: a torn last line is skipped with a warning)."""
    return read_jsonl(path)


class WandbSink:
    """W&B run for `LoggerSpec`; `mode=disabled` makes every call a no-op. Offline runs write
    `DIR/wandb/offline-run-*`; the run id is kept in `DIR/wandb_run_id` so `resume=true`
    continues the same run. Several sinks may be open in one process (the arms of
    `dflash2.training.arms`), each its own run."""

    def __init__(self, spec, out_dir: Path, config: dict, name: str | None):
        self.run = None
        if spec.mode == "disabled":
            return
        if spec.mode not in ("online", "offline"):
            raise ValueError(f"logger.mode={spec.mode!r}: use online, offline or disabled")
        import wandb

        id_file = Path(out_dir) / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        id_file.write_text(run_id)
        self.run = wandb.init(project=spec.project, entity=spec.entity, name=spec.name or name, group=spec.group,
                              tags=list(spec.tags), mode=spec.mode, dir=str(out_dir), config=config,
                              id=run_id, resume="allow", reinit="create_new")   # arms: one run each

    def log(self, row: dict, step: int) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


CONSOLE_KEYS = ("loss", "tau_proxy", "path_tau", "recall_at_k", "lr")


def console_postfix(row: dict) -> dict[str, str]:
    return {k: f"{row[k]:.3g}" for k in CONSOLE_KEYS if k in row}
