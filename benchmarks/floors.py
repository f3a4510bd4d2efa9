"""Timing helpers and the per-step floors of the engine benchmark (`benchmarks.engine`).

Floors, measured in the same process as the arms: copy bandwidth (a device-to-device `copy_`,
read + write); memory floor = (target weight bytes without the input embedding, plus the draft's
for speculative arms, plus the K/V bytes of `context` tokens per row) / bandwidth; GEMM stack =
the target's linear layers (LM head included) run on M = batch x (N + 1) rows (one CUDA graph of
the whole stack, median of replays); compute floor = 2 x linear params x M / the FLOP/s of a large
square GEMM. A cell's floor is the largest of the three.
"""

from __future__ import annotations

import statistics
import time

import torch


# ---------------------------------------------------------------------------------- timing

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_fn(fn, device: torch.device, reps: int, warmup: int = 2) -> float:
    """Median seconds of `fn()` (synchronized), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _time_graph(fn, device: torch.device, reps: int = 10) -> float:
    """Median seconds of one `fn()`: captured in a CUDA graph on CUDA (no launch cost), else eager."""
    if device.type != "cuda":
        return _time_fn(fn, device, reps)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (cuBLAS handles, workspaces)
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    secs = _time_fn(graph.replay, device, reps)
    del graph
    return secs


# ---------------------------------------------------------------------------------- floors

def copy_bandwidth_gbs(device: torch.device) -> float:
    """GB/s of a large device-to-device copy (bytes read + written): 1 GiB on CUDA, 64 MiB on CPU."""
    n = (1 << 28) if device.type == "cuda" else (1 << 24)
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    secs = _time_fn(lambda: dst.copy_(src), device, reps=20 if device.type == "cuda" else 5)
    return 2 * n * 4 / secs / 1e9


def gemm_flops(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of a square GEMM in `dtype` (8192^3 on CUDA, 512^3 on CPU)."""
    s = 8192 if device.type == "cuda" else 512
    a = torch.randn(s, s, device=device, dtype=dtype)
    b = torch.randn(s, s, device=device, dtype=dtype)
    secs = _time_fn(lambda: torch.matmul(a, b), device, reps=20 if device.type == "cuda" else 5)
    return 2 * s**3 / secs


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """Weights of every `nn.Linear` of an HF causal LM (decoder layers and LM head), in order."""
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]


def weight_bytes(model: torch.nn.Module, skip: torch.nn.Module | None = None) -> int:
    """Bytes of `model`'s parameters read per step: all but `skip`'s (the input embedding, of
    which a step reads only the batch's rows; a tied table is still counted as the head)."""
    skipped = {id(p) for p in skip.parameters()} if skip is not None else set()
    head = getattr(model, "lm_head", None)
    if head is not None:
        skipped.discard(id(head.weight))
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in skipped)


def gemm_stack_s(weights: list[torch.Tensor], m: int, device: torch.device) -> float:
    """Seconds of the linear layers alone on M rows: `x[M, in] @ W.T` for every weight."""
    xs = {w.shape[1]: torch.randn(m, w.shape[1], device=device, dtype=w.dtype) for w in weights}

    def stack():
        for w in weights:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    with torch.no_grad():
        return _time_graph(stack, device, reps=10 if device.type == "cuda" else 3)


class Floors:
    """Floors of one process (bandwidth and GEMM rate measured once, GEMM stacks per M)."""

    def __init__(self, hf_model, draft, device: torch.device, dtype: torch.dtype):
        self.device = device
        self.copy_gbs = copy_bandwidth_gbs(device)
        self.gemm_tflops = gemm_flops(device, dtype) / 1e12
        self.weights = linear_weights(hf_model)
        self.linear_params = sum(w.numel() for w in self.weights)
        self.target_bytes = weight_bytes(hf_model, skip=hf_model.get_input_embeddings())
        self.draft_bytes = weight_bytes(draft) if draft is not None else 0
        cfg = hf_model.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        # K and V of every layer: bytes per token of one row.
        self.kv_bytes_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * hd * dtype.itemsize
        self._stack: dict[int, float] = {}

    def cell(self, context: int, batch: int, n: int) -> dict:
        """Floors (ms) of one step at (context, batch, N) and the bytes they assume."""
        m = batch * (n + 1)
        if m not in self._stack:
            self._stack[m] = gemm_stack_s(self.weights, m, self.device)
        weights = self.target_bytes + (self.draft_bytes if n > 0 else 0)
        kv = self.kv_bytes_per_token * batch * context
        out = {"m_rows": m, "weights_gb": weights / 1e9, "kv_gb": kv / 1e9,
               "memory_ms": (weights + kv) / (self.copy_gbs * 1e9) * 1e3,
               "gemm_stack_ms": self._stack[m] * 1e3,
               "compute_ms": 2 * self.linear_params * m / (self.gemm_tflops * 1e12) * 1e3}
        out["floor_ms"] = max(out["memory_ms"], out["gemm_stack_ms"], out["compute_ms"])
        return out
