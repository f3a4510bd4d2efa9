"""The decoding step's report, read by the host without blocking on the step it just launched.

Each step of `DecodeState.step` ends by writing a `[REPORT_ROWS, B]` int64 report into a static
device buffer (rows `ACC`, `NEW`, `DONE`, `BAD`, `ACTIVE`, `END`, `VLEN` below). `StepReports.post(k)`
enqueues a copy of it into row `k` of a host buffer (pinned memory on CUDA, `non_blocking=True`,
then a CUDA event) right after step k is launched; `wait(k)` blocks until that copy has landed.
The loop in `dflash2.engine.generate` posts step k+1 before it waits for step k, so the device
always has the next step queued while the host reads the previous report: the host never blocks
on the step it just launched (it blocks on the one before, which the device has already run).

The copies of a call stay in the host buffer (one row per step), so the per-row accepted counts
are read once at the end of the call, not per step. Two events alternate: at most two copies are
in flight (steps k and k+1) when the host waits for step k.

`waits` and `posted` count the calls: the seam the CPU tests read to check that the loop only
waits for a step after posting the next one (a synchronous per-step read would break it).
"""

from __future__ import annotations

import numpy as np
import torch

# Rows of the step report, per batch row b:
ACC = 0  # accepted draft tokens of the step (0 for inactive rows)
NEW = 1  # tokens committed by the step (0 for inactive rows)
DONE = 2  # 1 once the row is finished (budget reached or a stop token committed)
BAD = 3  # 1 if an active row's target or draft logits were NaN / +inf / all -inf
ACTIVE = 4  # 1 if the row was still generating when the step began
END = 5  # committed tokens of the row (prompt + generated) after the step
VLEN = 6  # the step's verify length: drafted tokens it could accept (N, or less with verify="adaptive")
REPORT_ROWS = 7


class StepReports:
    """Host copies of a state's step report, one row per step, read asynchronously.

    Args:
        report: the state's static `[REPORT_ROWS, B]` device buffer the step writes.
        steps: host rows to hold (steps are numbered from 1; grows on demand with `reserve`).

    Attributes:
        posted, waits: how many copies were enqueued and how many waits the host made.
    """

    def __init__(self, report: torch.Tensor, steps: int):
        self.report = report
        self.cuda = report.device.type == "cuda"
        self.events = [torch.cuda.Event(), torch.cuda.Event()] if self.cuda else None
        self.host: torch.Tensor | None = None
        self.host_np: np.ndarray | None = None
        self.posted = self.waits = 0
        self.reserve(steps)

    def reserve(self, steps: int) -> None:
        """Hold at least `steps + 1` host rows (row 0 unused); call between calls, not mid-call."""
        if self.host is not None and self.host.shape[0] > steps:
            return
        self.host = torch.zeros(steps + 1, *self.report.shape, dtype=self.report.dtype, pin_memory=self.cuda)
        self.host_np = self.host.numpy()

    def post(self, step: int) -> None:
        """Enqueue the copy of the report that step `step` (just launched) writes; no host wait."""
        self.host[step].copy_(self.report, non_blocking=self.cuda)
        if self.cuda:
            self.events[step % 2].record()
        self.posted += 1

    def wait(self, step: int) -> np.ndarray:
        """Block until step `step`'s report is in host memory; returns it, `[REPORT_ROWS, B]` (a view)."""
        if self.cuda:
            self.events[step % 2].synchronize()
        self.waits += 1
        return self.host_np[step]

    def history(self, steps: int) -> np.ndarray:
        """Reports of steps 1..steps, `[steps, REPORT_ROWS, B]` (after their waits)."""
        return self.host_np[1:steps + 1]
