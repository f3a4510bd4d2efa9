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

import json
import math
import secrets
from pathlib import Path


class MetricsJsonl:
    """Append-only `metrics.jsonl`. On resume, rows after the resumed step are dropped, so a
    killed-and-resumed run has exactly one row per step."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = Path(path)
        if resume_step is not None and self.path.is_file():
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in keep))

    def write(self, row: dict) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
            fh.flush()


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class WandbSink:
    """W&B run for `LoggerSpec`; `mode=disabled` makes every call a no-op. Offline runs write
    `DIR/wandb/offline-run-*`; the run id is kept in `DIR/wandb_run_id` so `resume=true`
    continues the same run."""

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
                              id=run_id, resume="allow")

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
