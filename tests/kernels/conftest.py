"""Kernel test setup: the ``gpu`` marker and helpers.

``TRITON_INTERPRET=1`` is set by ``tests/conftest.py`` on machines without an NVIDIA device,
before anything imports triton (``@triton.jit`` picks the interpreter at decoration time).
With CUDA present the small-shape tests run the compiled kernels on the GPU.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped otherwise)")
    # The interpreter evaluates masked-off lanes too (log of 0, inf - inf) with numpy, which
    # warns; those lanes are discarded by tl.where, so the warnings carry no information.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def triton_device() -> str:
    """Device on which the Triton kernels run: CUDA if present, else CPU via the interpreter."""
    if not _triton_importable():
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")


@pytest.fixture
def cuda_device() -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not _triton_importable():
        pytest.skip("triton is not installed")
    return "cuda"


@pytest.fixture(autouse=True)
def _fresh_seed(request: pytest.FixtureRequest) -> None:
    """Fresh, reproducible random inputs per test case (seeded from the case id)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def error_within():
    """The STYLE.md item 6 comparison, as a fixture (test modules here are not a package)."""
    return assert_error_within


def assert_error_within(out: torch.Tensor, ref_same_dtype: torch.Tensor, exact: torch.Tensor, floor: float) -> None:
    """STYLE.md item 6: the kernel's error against a fp64 ground truth may be at most twice the
    torch reference's error at the same dtype, plus ``floor`` (for cases where torch is exact)."""
    assert torch.isfinite(out).all(), "non-finite output"
    err_kernel = (out.double() - exact.double()).abs().max().item()
    err_torch = (ref_same_dtype.double() - exact.double()).abs().max().item()
    assert err_kernel <= 2.0 * err_torch + floor, f"kernel error {err_kernel:.3g} vs torch error {err_torch:.3g}"
