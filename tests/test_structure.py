"""Two structure contracts: `GroupedDynamicConv` resolves its kernel implementation once (not
per forward), and `dflash2.checkpoint` does not import the model (no import circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import dflash2.modeling.conv as conv_module
from dflash2.kernels import dispatch
from dflash2.modeling import GroupedDynamicConv

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def resolutions(monkeypatch):
    """Count calls of `resolve_impl` made by the conv module."""
    calls: list[tuple[str, str]] = []
    real = conv_module.resolve_impl

    def counting(impl, device):
        calls.append((impl, str(device)))
        return real(impl, device)

    # Patch the definition too, so a deferred `from ... import resolve_impl` in forward is seen.
    monkeypatch.setattr(dispatch, "resolve_impl", counting)
    monkeypatch.setattr(conv_module, "resolve_impl", counting, raising=False)
    return calls


def _apply(conv: GroupedDynamicConv, z: torch.Tensor) -> torch.Tensor:
    return conv(z, conv.project(z), 0, z.shape[1])


def test_conv_resolves_impl_once(resolutions):
    conv = GroupedDynamicConv(16, 2, 4, impl="auto")
    z = torch.randn(1, 4, 16)
    with torch.no_grad():
        outs = [_apply(conv, z) for _ in range(5)]
    assert resolutions == [("auto", "cpu")]
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_conv_resolves_again_after_impl_or_device_change(resolutions):
    conv = GroupedDynamicConv(16, 2, 4, impl="auto")
    z = torch.randn(1, 4, 16)
    with torch.no_grad():
        _apply(conv, z)
        conv.impl = "torch"      # a new default impl for the module
        _apply(conv, z)
        _apply(conv, z)
        conv.double()            # `.to(...)` may move the module: the next call decides again
        _apply(conv, z.double())
    assert resolutions == [("auto", "cpu"), ("torch", "cpu"), ("torch", "cpu")]
    assert conv.impl == "torch"


def test_conv_forward_does_not_resolve_again(monkeypatch):
    """STYLE 3: resolving (which reads TRITON_INTERPRET) stays off the per-step path."""
    conv = GroupedDynamicConv(16, 2, 4, impl="auto")
    z = torch.randn(1, 4, 16)
    with torch.no_grad():
        _apply(conv, z)

        def forbidden(*_a, **_k):
            raise AssertionError("forward resolved the implementation again")

        monkeypatch.setattr(dispatch, "resolve_impl", forbidden)
        monkeypatch.setattr(conv_module, "resolve_impl", forbidden, raising=False)
        _apply(conv, z)


def _imported_modules(path: Path) -> set[str]:
    """Every module an `import` statement in `path` names, at any nesting level."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_checkpoint_does_not_import_the_model():
    """`modeling/draft.py` imports `checkpoint.py`; the reverse edge (even a deferred import
    inside a function) would close a circle."""
    assert "dflash2.checkpoint" in _imported_modules(ROOT / "dflash2" / "modeling" / "draft.py")
    assert not any(m.startswith("dflash2.modeling") for m in _imported_modules(ROOT / "dflash2" / "checkpoint.py"))


@pytest.mark.parametrize("v2", [True, False], ids=["dflash2", "v1"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_tensor_contract_equals_the_model(v2, bias):
    """`expected_tensor_shapes` writes the z-lab contract out as data; it must equal the model."""
    from dflash2.checkpoint import expected_tensor_shapes
    from dflash2.modeling import DFlash2DraftModel
    from tests.conftest import tiny_draft_config

    cfg = tiny_draft_config(v2=v2, layers=3, target_layer_ids=[0, 1, 3])
    cfg.attention_bias = bias
    with torch.device("meta"):
        model = DFlash2DraftModel(cfg)
    assert expected_tensor_shapes(cfg) == {k: tuple(v.shape) for k, v in model.state_dict().items()}
