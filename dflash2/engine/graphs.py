"""CUDA-graph replay of the engine's steady-state decoding step.

`speculative_generate` keeps its whole per-step state in static device buffers (tokens, lengths,
finished flags, the target and draft caches, the next step's context features, and a
`[REPORT_ROWS, B]` report of accepted counts / new tokens / finished / invalid / active rows /
lengths) and writes them in place. The step body therefore has no inputs but those buffers, which
is what a CUDA graph needs: capture it once and every later step is one `replay()` plus the
asynchronous device-to-host copy of the report (`dflash2.engine.reports`), which the loop reads
one step later to know which rows are done.

What changes the step's shapes gets a graph of its own: the K/V length handed to the target's
attention (`kv_len`, rounded up to `GRAPH_KV_BUCKET` slots, so a graph serves every step whose
rows fit its bucket; masked tail slots change no result). The batch size and N are fixed for a
state (`dflash2.engine.state.DecodeState`: a batch bucket), and its graphs live as long as it
does: a later call that reuses the state replays them with no capture. A call's first step is a
replay too when it has the later steps' shape (the AR arm; a proposer that took the prompt's
features after the prefill, `DecodeState.start`); a proposer that reads the prompt's features in
its first step runs that step eagerly. The first step of every new bucket runs eagerly: it is the
warm-up that the capture needs (lazy kernel compilation, cuBLAS workspaces), and then the
bucket's graph is captured (capture runs no kernels, so the state is not advanced twice).

The batched prefill (`dflash2.engine.prefill.prefill_forward`) is held the same way, in a second
`StepGraphs` of the state keyed by its `PrefillShape` (row count, padded length, rows per forward) instead of
a K/V length: `run(key)` returns the body's outputs, the eager run's at a key's first call and the
captured graph's static outputs (rewritten by each replay) afterwards.

If a capture fails (a model whose forward does something a graph cannot hold, e.g. a host
synchronization), the call warns once with the error and finishes on the eager loop: the output
is the same, only slower. The counters say so (`captures` stays 0, `failed` holds the error);
the GPU tests assert replays, so a fallback never passes them silently.

Debugging aid: with `sync_check(True)` every replay runs under
`torch.cuda.set_sync_debug_mode("error")`, so a host synchronization inside the replayed step
(which would mean the step is not what was captured, or that something syncs) raises.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Hashable, Iterator

import torch

GRAPH_KV_BUCKET = 256  # K/V slots per graph bucket (a new graph every 256 committed tokens at most)
_SYNC_CHECK = False


@contextlib.contextmanager
def sync_check(enabled: bool = True) -> Iterator[None]:
    """Inside the block, graph replays run with `torch.cuda.set_sync_debug_mode("error")`."""
    global _SYNC_CHECK
    previous, _SYNC_CHECK = _SYNC_CHECK, bool(enabled)
    try:
        yield
    finally:
        _SYNC_CHECK = previous


class StepGraphs:
    """The captured steps of one decoding state (kept across calls), one CUDA graph per key: the
    K/V bucket of the decoding step, or the prefill's shape.

    Args:
        body: `body(key)` runs one decoding step (or prefill) on the static state, in place, with
            no host synchronization (it is what gets captured); what it returns (tensors or None)
            is what `run` hands back.
        device: the CUDA device.
        what: what the body is, for the capture-failure warning.

    Attributes:
        replays: steps that ran as a graph replay.
        captures: graphs captured (one per K/V bucket reached).
        eager_steps: steps that ran eagerly through `step` (each bucket's warm-up, and every step
            after a failed capture).
        failed: the capture error, if a capture failed (the call then stays eager).
    """

    def __init__(self, body: Callable[[Hashable], object], device: torch.device, what: str = "the decoding step"):
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.body, self.device, self.what = body, device, what
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[Hashable, object] = {}  # per captured key, the body's static outputs
        self.pool = None  # one memory pool shared by the state's graphs (they never run concurrently)
        self.replays = self.captures = self.eager_steps = 0
        self.failed: str | None = None

    def step(self, kv_len: int) -> bool:
        """Run one step with K/V length `kv_len`; True when it was a graph replay."""
        return self.run(kv_len)[0]

    def run(self, key: Hashable) -> tuple[bool, object]:
        """Run the body for `key`: `(replayed, outputs)`. The first call per key runs it eagerly
        (its outputs are returned) and captures it; later calls replay the graph and return the
        captured outputs, which the next replay of that key overwrites."""
        graph = self.graphs.get(key)
        if graph is None:
            out = self.body(key)  # the real run, and the warm-up of this key's shapes
            self.eager_steps += 1
            if self.failed is None:
                self._capture(key)
            return False, out
        if _SYNC_CHECK:
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                graph.replay()
            finally:
                torch.cuda.set_sync_debug_mode(previous)
        else:
            graph.replay()
        self.replays += 1
        return True, self.outputs[key]

    def _capture(self, key: Hashable) -> None:
        """Record the body for `key` (runs no kernel, so the state does not advance)."""
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.body(key)
        except RuntimeError as e:  # the body cannot be held in a graph: run it eagerly from now on
            self.failed = f"{type(e).__name__}: {e}"
            warnings.warn(f"dflash2: CUDA-graph capture of {self.what} failed ({self.failed}); it runs eagerly "
                          "from now on (same output, slower). Pass graphs=False to skip the attempt.",
                          RuntimeWarning, stacklevel=4)
            return
        self.pool = graph.pool()
        self.graphs[key] = graph
        self.outputs[key] = out
        self.captures += 1
