"""resolve_impl: auto / torch / triton, and an explicit triton that cannot run says how to fix it."""

from __future__ import annotations

import pytest
import torch

from dflash2.kernels import dispatch
from dflash2.kernels.dispatch import resolve_impl


def test_torch_and_auto_on_cpu() -> None:
    assert resolve_impl("torch", "cpu") == "torch"
    assert resolve_impl("auto", "cpu") == "torch"  # auto never picks the interpreter
    assert resolve_impl("torch", torch.device("cpu")) == "torch"


def test_unknown_impl_raises() -> None:
    with pytest.raises(ValueError, match="impl must be one of"):
        resolve_impl("cuda", "cpu")


def test_explicit_triton_on_cpu_needs_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_impl("triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_impl("triton", "cpu") == "triton"


def test_missing_triton_says_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    with pytest.raises(RuntimeError, match="pip install triton"):
        resolve_impl("triton", "cuda")
    assert resolve_impl("auto", "cuda") == "torch"


def test_cuda_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    assert resolve_impl("auto", "cuda") == "triton"
    assert resolve_impl("triton", "cuda:0") == "triton"
