"""Whole-call wall clock: the one per-step measure of every arm of `benchmarks.engine`, and the
readings that explain it (garbage collections inside the calls, a call's own step readings)."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Iterator

import torch

from benchmarks.floors import sync

wall_clock = time.perf_counter  # the clock of `wall_step_ms` (a module attribute: tests replace it)


def wall_step_ms(call, new_tokens: int, steps: int, repeats: int, device: torch.device) -> tuple[float, dict]:
    """The one per-step measure of every arm: (t(new_tokens) - t(1)) / steps in ms, each t the
    median wall time of `repeats` whole calls `call(max_new_tokens)`, the device synchronized only
    before and after a call. `steps`: decoding steps of the `new_tokens` call (new_tokens - 1
    for HF and our AR; the call's steps for a speculative arm)."""
    def timed(n: int) -> float:
        sync(device)
        t = wall_clock()
        call(n)
        sync(device)
        return wall_clock() - t

    with gc_pauses() as pauses:
        fulls = [timed(new_tokens) for _ in range(repeats)]
    ones = [timed(1) for _ in range(repeats)]
    full, one = statistics.median(fulls), statistics.median(ones)
    return (full - one) / steps * 1e3, {"call_ms": full * 1e3, "one_token_call_ms": one * 1e3, "steps": steps,
                                        "calls_ms": [t * 1e3 for t in fulls],
                                        "one_token_calls_ms": [t * 1e3 for t in ones],
                                        "gc_pauses": len(pauses), "gc_ms": sum(pauses) * 1e3,
                                        "gc_max_ms": max(pauses, default=0.0) * 1e3}


@contextlib.contextmanager
def gc_pauses() -> Iterator[list[float]]:
    """Seconds of each garbage collection that runs inside the block (Python's `gc.callbacks`)."""
    pauses: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(on_gc)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(on_gc)


def pipelined_readings(t, warmup_steps: int) -> dict:
    """From a timed call's own (unsynchronized) step readings: per step, the host wall time between
    two reports arriving (`pipelined_step_ms`) and the host time in the graph replay call
    (`launch_ms`), as median and max over the steps after the warm-up, in ms. A step wall time
    above the synchronized in-step time, or a launch near it, says where host time per step goes."""
    def med_max(xs: list[float]) -> tuple[float | None, float | None]:
        xs = xs[warmup_steps:]
        return (statistics.median(xs) * 1e3, max(xs) * 1e3) if xs else (None, None)

    step_med, step_max = med_max(t.verify)
    launch_med, launch_max = med_max(t.launch)
    return {"pipelined_step_ms": step_med, "pipelined_step_max_ms": step_max,
            "launch_ms": launch_med, "launch_max_ms": launch_max}
