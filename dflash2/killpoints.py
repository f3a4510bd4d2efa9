"""TEST HOOK: make a process SIGKILL itself at a named point of a distillation, so crash-safety
tests hit "during a checkpoint save" and "during a metrics write" deterministically.

    DFLASH2_KILL_AT=<point>@<step>        e.g. checkpoint_save@4, metrics_write@6

The variable is read once, by `arm_from_env()`, which the distillation entry points call at
start (`train/distill.py`, `python -m tests.training.distill_helpers`); unset, every
`reached()` is a no-op. It is never meant for real runs. Points:

    checkpoint_save   `dflash2.training.state.save_checkpoint` of that step, after the weights
                      are in the temporary directory and before the trainer state and the
                      COMPLETE marker: the kill leaves a torn `step_<n>.tmp/`
    metrics_write     the `metrics.jsonl` row of that step: the first half of the row's line is
                      written (flushed, fsynced, no newline), then the kill: a torn last line
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV = "DFLASH2_KILL_AT"
POINTS = ("checkpoint_save", "metrics_write")

_armed: tuple[str, int] | None = None


def arm_from_env(env=None) -> tuple[str, int] | None:
    """Read `DFLASH2_KILL_AT` (from `env`, default `os.environ`) and arm the hook; returns the
    armed `(point, step)` or None. Raises `ValueError` for a malformed value."""
    global _armed
    value = (os.environ if env is None else env).get(ENV, "").strip()
    if not value:
        _armed = None
        return None
    point, _, step = value.partition("@")
    if point not in POINTS or not step.isdigit():
        raise ValueError(f"{ENV}={value!r}: use <point>@<step> with point one of {', '.join(POINTS)}")
    _armed = (point, int(step))
    return _armed


def reached(point: str, step: int, *, torn_file: Path | None = None, row: dict | None = None) -> None:
    """Kill this process (SIGKILL) if the hook is armed for `(point, step)`; else return at once.

    With `torn_file` and `row`, first append the first half of `row`'s JSONL line to `torn_file`
    (a write killed midway)."""
    if _armed is None or _armed != (point, int(step)):
        return
    if torn_file is not None and row is not None:
        from dflash2.jsonl import dumps_line

        line = dumps_line(row)
        with open(torn_file, "a") as fh:
            fh.write(line[: len(line) // 2])
            fh.flush()
            os.fsync(fh.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
