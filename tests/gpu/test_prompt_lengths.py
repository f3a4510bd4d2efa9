"""GPU check that a prompt of a new length compiles nothing when its length falls in shape
classes the process has met. In each engine mode, AR and DFlash2 first run prompts of 17-31 and
33-47 tokens (their kernels' constexpr classes: row tiles, key splits), none divisible by 16.
Then a 32-token prompt and a 48-token prompt must leave the number of Triton binaries of
dflash2's kernels unchanged, with the speculative output equal to AR's in exact mode. Triton
specializes an integer argument on divisibility by 16 unless told not to, so a prompt-length
argument left specialized fails this test.

Run on the device:  python -m pytest -m gpu tests/gpu/test_prompt_lengths.py
"""

from __future__ import annotations

import pytest
import torch

from dflash2.engine import speculative_generate
from dflash2.kernels.dispatch import triton_binaries
from tests.gpu.helpers import small_cuda_models

pytestmark = pytest.mark.gpu

MODES = {"normal": {}, "exact invariant": {"exact": True, "exact_impl": "invariant"}}


@pytest.fixture(scope="module")
def models():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return small_cuda_models(vocab=512)


@pytest.mark.parametrize("mode", list(MODES))
def test_new_prompt_lengths_compile_no_triton_binary(models, mode):
    target, draft, _ = models
    kw = {**MODES[mode], "exact_block_size": draft.block_size} if MODES[mode] else {}
    gen = torch.Generator().manual_seed(1)
    prompt = lambda n: torch.randint(0, 511, (n,), generator=gen).cuda()  # noqa: E731

    def both(length: int) -> None:
        p = prompt(length)
        ar = speculative_generate(target, None, [p], max_new_tokens=24, **kw)
        sp = speculative_generate(target, draft, [p], max_new_tokens=24, num_speculative_tokens=3, **kw)
        if kw:  # exact mode: speculative == AR token for token
            assert torch.equal(ar.generated[0], sp.generated[0]), length

    for length in [*range(17, 32), *range(33, 48)]:  # compiles allowed: the classes met here
        both(length)
    before = triton_binaries(per_kernel=True)
    assert sum(before.values()) > 0
    for length in (32, 48):
        both(length)
    after = triton_binaries(per_kernel=True)
    grown = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert not grown, f"Triton binaries compiled for new prompt lengths: {grown}"
