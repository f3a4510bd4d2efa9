"""GPU: the CUDA-graph step with torch.compile'd target and draft modules (`compile_level`).

Fresh models per test: a compile is in place, and the other GPU tests must keep the stock path.
In fp32 on a small random Qwen3 target and DFlash2 draft:
- losslessness on the compiled path: greedy speculative output (the DFlash2 draft, and the device
  oracle, which accepts long runs) equals the compiled AR output token for token;
- the same with the small-M linear kernel inside the compiled modules (`linear_impl="triton"`;
  light + triton is the engine's default on CUDA);
- the compiled graph path equals the uncompiled eager loop token for token (fp32: fused kernels
  change only the rounding);
- every step after the first and each bucket's warm-up is a graph replay, run under
  `torch.cuda.set_sync_debug_mode("error")` (a compiled module that synchronized, or fell back to
  a recompile inside the capture, would fail here).

Run on the device:  python -m pytest -m gpu tests/gpu/test_compiled.py -s
"""

from __future__ import annotations

import pytest
import torch

from dflash2 import speculative_generate
from dflash2.engine.graphs import sync_check
from dflash2.evaluation.arms.oracle_proposers import DeviceOracleProposer
from tests.gpu.helpers import small_cuda_models

pytestmark = pytest.mark.gpu

VOCAB = 4096


@pytest.mark.parametrize("level,linear", [("light", "torch"), ("light", "triton"), ("full", "torch"),
                                          ("full", "triton")])
def test_compiled_graph_path_is_lossless_and_replays(level, linear):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    target, draft, prompts = small_cuda_models(VOCAB)  # fresh: compiles work in place
    new = 80
    stock = speculative_generate(target, None, prompts, max_new_tokens=new, graphs=False, compile_level=None,
                                 linear_impl="torch")  # the stock modules: each test compiles its own level
    with sync_check():
        ar = speculative_generate(target, None, prompts, max_new_tokens=new, compile_level=level, linear_impl=linear)
    assert [s.tolist() for s in ar.sequences] == [s.tolist() for s in stock.sequences]
    refs = [p.tolist() + g.tolist() for p, g in zip(prompts, ar.generated)]
    oracle = DeviceOracleProposer(refs, [1, 2, 3, 4], 16, 0.9, VOCAB, "cuda")
    for drafter, n in ((draft, 7), (oracle, 15)):
        with sync_check():
            spec = speculative_generate(target, drafter, prompts, max_new_tokens=new, num_speculative_tokens=n,
                                        compile_level=level, linear_impl=linear)
        assert [s.tolist() for s in spec.sequences] == [s.tolist() for s in ar.sequences]
        t = spec.times
        assert t.graph_error is None and t.graph_captures >= 1
        assert t.graph_replays == len(t.verify) - t.graph_captures > 0
        steps = sum(map(len, spec.accepted))
        tau = (sum(map(sum, spec.accepted)) + steps) / steps
        print(f"{level} {type(drafter).__name__} N={n}: tau {tau:.2f}, {t.graph_replays} replays")
        if drafter is oracle:
            assert tau >= 3.0
