"""Sampling controls for the target distribution p, per-row seeds, and logit guards.

Only the target distribution p is shaped by temperature, top-k and top-p; the draft's
proposal q depends on the temperature alone (spec 5.4: "only temperature enters q"). The
acceptance test `u * q(x) < p(x)` stays exact for any q that is the true proposal law, so
filtering p (which changes the target law we sample from) never needs a matching change to q.

Seeds: row `b` of a call with `seed` gets `row_seed(seed, b)`, a splitmix64 hash of both, so
a row's sampled output depends on its own seed and prompt only, never on its batch
neighbours. The keyed noise itself (draft / accept / target streams, keyed by seed, position
and token id) lives in `dflash2.kernels.keyed_random`.
"""

from __future__ import annotations

import torch

from dflash2.kernels.topk import invalid_rows_reference

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def row_seed(seed: int, row: int) -> int:
    """Per-row seed in [0, 2^63): a hash of the call seed and the row index."""
    return _splitmix64(_splitmix64(int(seed) & _MASK64) ^ (int(row) & _MASK64)) >> 1


def row_seeds(seed, batch_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """`[B]` int64 seeds. `seed=None` draws a base seed from torch's global generator.

    `seed` may also hold one int per row: row b then gets `row_seed(seed[b], 0)`, exactly what
    a batch of one with `seed=seed[b]` gets, so a caller that keys seeds by sample id (the
    evaluation runner) can batch sampled rows without changing any row's draws.
    """
    if seed is not None and not isinstance(seed, int):
        seeds = seed.tolist() if isinstance(seed, torch.Tensor) else list(seed)
        if len(seeds) != batch_size:
            raise ValueError(f"seed has {len(seeds)} entries for {batch_size} rows; pass one per row")
        return torch.tensor([row_seed(s, 0) for s in seeds], dtype=torch.long, device=device)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    return torch.tensor([row_seed(seed, b) for b in range(batch_size)], dtype=torch.long, device=device)


def filter_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Target logits -> the `verify_block` input: fp32, divided by T, top-k/top-p as -inf.

    Args:
        logits: `[B, M, V]` any float dtype.
        temperature: `[B]` fp32; rows with T = 0 are returned raw (greedy), never divided.
        top_k: keep the k largest per row (ties at the k-th value kept); 0 = off.
        top_p: keep the smallest top set whose probability reaches top_p (the top token always
            survives); 1.0 = off.
    Returns:
        `[B, M, V]` fp32.
    """
    out = logits.float()
    sampled = temperature > 0  # [B]; no host sync here: callers skip this for all-greedy batches
    t = torch.where(sampled, temperature, torch.ones_like(temperature)).float()
    scaled = out / t[:, None, None]
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]  # [B, M, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_vals, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_vals, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of strictly better tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.where(sampled[:, None, None], scaled, out)


def invalid_rows(logits: torch.Tensor) -> torch.Tensor:
    """`[B]` bool: rows of `logits [B, ..., V]` with a NaN, a +inf, or no finite entry anywhere.

    Such rows have no defined argmax/softmax; the engine raises instead of emitting a token.
    """
    # Each of the row's M vectors judged alone (one amax each), then any of them.
    return invalid_rows_reference(logits.reshape(-1, logits.shape[-1])).view(logits.shape[0], -1).any(-1)
