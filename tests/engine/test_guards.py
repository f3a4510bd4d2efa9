"""Rows whose logits are NaN, +inf or entirely -inf raise; they never emit a token."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from tests.engine.helpers import qwen3_target, random_draft

V = 16
PROMPTS = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6])]


def poison(model, value: float, *, row: int, call: int, width: int | None):
    """Forward hook on the LM head: on its `call`-th output of block width `width` (None =
    any), set batch row `row` to `value` (NaN, +inf, or -inf for every entry)."""
    seen = {"n": 0}

    def hook(_module, _inp, out):
        if width is None or out.shape[1] == width:
            seen["n"] += 1
            if seen["n"] == call:
                out = out.clone()
                out[row] = value
                return out
        return out

    return model.lm_head.register_forward_hook(hook)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "+inf", "all-inf"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("where", ["prefill", "verify", "draft"])
def test_bad_logits_raise(value, temperature, where):
    target = qwen3_target(vocab=V, seed=3)
    n = 3
    call, width = {"prefill": (1, None), "verify": (2, n + 1), "draft": (2, n)}[where]
    handle = poison(target, value, row=1, call=call, width=width)
    try:
        with pytest.raises(ValueError, match="NaN"):
            speculative_generate(target, random_draft(vocab=V), PROMPTS, max_new_tokens=12,
                                 num_speculative_tokens=n, temperature=temperature, seed=0)
    finally:
        handle.remove()
    # the same call without poison runs
    out = speculative_generate(target, random_draft(vocab=V), PROMPTS, max_new_tokens=12,
                               num_speculative_tokens=n, temperature=temperature, seed=0)
    assert all(len(g) == 12 for g in out.generated)


def test_bad_logits_raise_in_ar_mode():
    target = qwen3_target(vocab=V, seed=3)
    handle = poison(target, float("nan"), row=0, call=3, width=1)
    try:
        with pytest.raises(ValueError, match="NaN"):
            speculative_generate(target, None, PROMPTS, max_new_tokens=8)
    finally:
        handle.remove()
