"""GPU: the batched prefill as a CUDA graph per `PrefillShape` (dflash2.engine.prefill).

In normal mode and in invariant exact mode, AR and a random DFlash2 draft (which reads the prompt
features the prefill returns):
- a call on a fresh state captures its prefill's graph; a later call whose prompts differ but pad
  to the same 64-token bucket replays it (`times.prefill_graph == "replay"`, under `sync_check`:
  no host synchronization in the replay) and gives the eager path's tokens and acceptances
  (`graphs=False`) for its own prompts; a prompt past the bucket captures a new graph;
- exact mode: the speculative output equals AR's, token for token.

Run on the device:  python -m pytest -m gpu tests/gpu/test_prefill_graphs.py
"""

from __future__ import annotations

import pytest
import torch

from dflash2 import speculative_generate
from dflash2.engine.graphs import sync_check
from dflash2.engine.kept import release_decode_state
from tests.gpu.helpers import small_cuda_models

pytestmark = pytest.mark.gpu

VOCAB = 512
MODES = {"normal": {}, "exact invariant": {"exact": True, "exact_impl": "invariant", "exact_block_size": 16}}


@pytest.fixture(scope="module")
def models():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return small_cuda_models(VOCAB)


def _prompts(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (n,), generator=gen).cuda() for n in lengths]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["ar", "dflash2"])
def test_prefill_graph_is_replayed_for_other_prompts_of_its_shape(models, mode, kind):
    target, draft, _ = models
    drafter = draft if kind == "dflash2" else None
    kw = dict(max_new_tokens=40, num_speculative_tokens=7 if drafter is not None else None, **MODES[mode])
    release_decode_state(target)  # a fresh state: the first call captures
    calls = [_prompts((5, 17, 9, 30), 0),      # bucket 64: captured
             _prompts((12, 40, 3, 61), 1),     # other tokens and lengths, bucket 64: replayed
             _prompts((12, 70, 3, 61), 2)]     # a prompt past 64: a new shape, captured
    seen = []
    for prompts in calls:
        eager = speculative_generate(target, drafter, prompts, graphs=False, **kw)
        with sync_check():
            graphed = speculative_generate(target, drafter, prompts, graphs=True, **kw)
        assert [s.tolist() for s in graphed.sequences] == [s.tolist() for s in eager.sequences]
        assert graphed.accepted == eager.accepted
        seen.append(graphed.times.prefill_graph)
        if mode != "normal" and drafter is not None:  # exact: speculative == AR
            ar = speculative_generate(target, None, prompts, graphs=True, **kw | {"num_speculative_tokens": None})
            assert [g.tolist() for g in graphed.generated] == [g.tolist() for g in ar.generated]
    assert seen == ["capture", "replay", "capture"]
