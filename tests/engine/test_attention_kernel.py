"""The engine with the Triton attention kernel (`attention_impl="triton"`; the interpreter on CPU)
gives the same tokens as with the SDPA reference (on CPU models; the GPU side is
`tests/kernels/test_row_attention.py` and the engine benchmark): greedy AR and speculative, a sliding-window
target, rows of different lengths (so different positions per row)."""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.engine.inputs import GenerateInputError
from dflash2.target import TargetModel
from tests.conftest import tiny_llama
from tests.engine.helpers import qwen3_target, random_draft

V = 300
PROMPTS = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17])]


@pytest.fixture
def triton_cpu():
    pytest.importorskip("triton")
    from dflash2.kernels.dispatch import triton_interpreter_enabled

    if not triton_interpreter_enabled():  # the models here are on the CPU
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py on machines without CUDA)")


@pytest.mark.parametrize("kind", ["qwen3-sliding", "llama"])
def test_triton_attention_gives_the_reference_tokens(kind, triton_cpu):
    model = (qwen3_target.__wrapped__(vocab=V, sliding=True) if kind == "qwen3-sliding"
             else tiny_llama(vocab=V, layers=3)).float()
    target = TargetModel(model)
    arms = [(None, None)]
    if kind == "qwen3-sliding":  # and the speculative path (verify blocks of 4 queries)
        arms.append((random_draft.__wrapped__(vocab=V).float(), 3))
    for drafter, n in arms:
        kw = dict(max_new_tokens=12, num_speculative_tokens=n, seed=0)
        ref = speculative_generate(target, drafter, PROMPTS, **kw)
        out = speculative_generate(target, drafter, PROMPTS, attention_impl="triton", **kw)
        assert [s.tolist() for s in out.sequences] == [s.tolist() for s in ref.sequences]
        assert out.accepted == ref.accepted


def test_attention_impl_is_checked():
    target = TargetModel(tiny_llama(vocab=V, layers=1))
    with pytest.raises(GenerateInputError, match="attention_impl"):
        speculative_generate(target, None, PROMPTS, max_new_tokens=2, attention_impl="flash")
