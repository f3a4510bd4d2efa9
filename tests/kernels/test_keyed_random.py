"""Keyed RNG: torch and Triton bit-identical, values in (0, 1), streams disjoint, uniform."""

from __future__ import annotations

import math

import pytest
import torch

from dflash2.kernels.keyed_random import (
    ACCEPT_STREAM,
    DRAFT_STREAM,
    TARGET_STREAM,
    keyed_uniform,
    keyed_uniform_triton,
)

STREAMS = {"draft": DRAFT_STREAM, "accept": ACCEPT_STREAM, "target": TARGET_STREAM}
MASK = 0xFFFFFFFF


def _python_uniform(seed: int, stream: int, position: int, index: int) -> float:
    """The hash written out with Python's unbounded ints, straight from the module docstring."""

    def mix(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & MASK
        x ^= x >> 15
        x = (x * 0x2C1B3C6D) & MASK
        return x ^ (x >> 16)

    seed &= (1 << 64) - 1
    position &= (1 << 64) - 1
    h = mix(((seed & MASK) + 0x1B873593) & MASK)
    h = mix(h ^ (seed >> 32))
    h = mix(h ^ stream)
    h = mix(h ^ (position & MASK))
    h = mix(h ^ (position >> 32))
    h = mix((mix(h ^ index) + 0x68E31DA4) & MASK)
    return ((h >> 9) + 0.5) * 2.0**-23


def _random_keys(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seed = torch.randint(-(2**62), 2**62, (n,))
    pos = torch.randint(0, 2**40, (n,))
    idx = torch.randint(0, 2**32, (n,))
    seed[:3] = torch.tensor([0, -1, 2**63 - 1])
    idx[:3] = torch.tensor([0, 2**32 - 1, 151935])
    return seed, pos, idx


def test_torch_matches_python_ints() -> None:
    seed, pos, idx = _random_keys(64)
    for stream in STREAMS.values():
        u = keyed_uniform(seed, stream, pos, idx)
        expect = [_python_uniform(int(s), stream, int(p), int(i)) for s, p, i in zip(seed, pos, idx)]
        assert u.tolist() == expect  # exact: both are exact fp32 values


@pytest.mark.parametrize("stream", list(STREAMS), ids=list(STREAMS))
def test_triton_bit_identical(stream: str, triton_device: str) -> None:
    seed, pos, idx = (t.to(triton_device) for t in _random_keys(3000))
    a = keyed_uniform(seed, STREAMS[stream], pos, idx)
    b = keyed_uniform_triton(seed, STREAMS[stream], pos, idx)
    assert torch.equal(a, b)


def test_open_interval_and_grid() -> None:
    seed, pos, idx = _random_keys(100_000)
    u = keyed_uniform(seed, TARGET_STREAM, pos, idx)
    assert u.dtype == torch.float32
    assert (u > 0).all() and (u < 1).all()
    grid = u.double() * 2**23 - 0.5  # every value is (m + 0.5) * 2^-23
    assert torch.equal(grid, grid.round())


def test_streams_disjoint_for_same_counter() -> None:
    seed, pos, idx = _random_keys(20_000)
    d = keyed_uniform(seed, DRAFT_STREAM, pos, idx)
    a = keyed_uniform(seed, ACCEPT_STREAM, pos, idx)
    t = keyed_uniform(seed, TARGET_STREAM, pos, idx)
    # Distinct 32-bit hashes can still share their top 23 bits: expect ~2^-23 collisions a pair.
    assert (d == t).sum() <= 2 and (d == a).sum() <= 2 and (a == t).sum() <= 2


# chi-square critical values at false-alarm rate 1e-3 (scipy.stats.chi2.ppf(0.999, dof)).
CHI2_999 = {63: 103.44, 255: 330.52}


def _chi2(counts: torch.Tensor) -> float:
    expected = counts.sum().item() / counts.numel()
    return float(((counts.double() - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("layout", ["sequential_index", "sequential_position", "sequential_seed"])
def test_uniform_histogram(layout: str) -> None:
    # Fixed keys -> deterministic; each test has a 1e-3 false-alarm rate by construction.
    n = 1 << 18
    ar = torch.arange(n)
    seed, pos, idx = {
        "sequential_index": (torch.tensor(7), torch.tensor(1234), ar),
        "sequential_position": (torch.tensor(7), ar, torch.tensor(0)),
        "sequential_seed": (ar, torch.tensor(99), torch.tensor(5)),
    }[layout]
    u = keyed_uniform(seed, TARGET_STREAM, pos, idx)
    counts = torch.bincount((u * 64).long(), minlength=64)
    assert _chi2(counts) < CHI2_999[63]
    # Pairs of neighbours: the joint law of (u_n, u_{n+1}) on a 16 x 16 grid is uniform too.
    cells = (u[:-1] * 16).long() * 16 + (u[1:] * 16).long()
    assert _chi2(torch.bincount(cells, minlength=256)) < CHI2_999[255]
    assert math.isclose(u.double().mean().item(), 0.5, abs_tol=5 * (1 / 12 / n) ** 0.5)
