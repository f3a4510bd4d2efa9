"""Models and small tools shared by the GPU tests."""

from __future__ import annotations

import json
import os

import torch

from dflash2 import DFlash2DraftModel
from tests.conftest import randomize_, tiny_draft_config, tiny_qwen3


def small_cuda_models(vocab: int):
    """(target, draft, prompts) in fp32 on CUDA: a 4-layer Qwen3 (hidden 128), a random DFlash2
    draft (block 16, top-16, rank 32) on its layers 0 and 2, and four prompts of 5-30 tokens."""
    target = tiny_qwen3(vocab=vocab, hidden=128, layers=4, seed=0).cuda().float()
    cfg = tiny_draft_config(hidden=128, vocab=vocab, block_size=16, selector_top_k=16, selector_rank=32,
                            conv_group_size=16, target_layer_ids=[0, 2])
    draft = randomize_(DFlash2DraftModel(cfg), seed=1, std=0.05).cuda().float().eval()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab - 1, (n,), generator=gen).cuda() for n in (5, 17, 9, 30)]
    return target, draft, prompts


def cuda_models_then_write(vocab: int, name: str, results: dict):
    """A module fixture's body: `small_cuda_models(vocab)` (skipped without CUDA), then, after the
    module's tests, `results` written as `$DFLASH2_GPU_OUT/<name>` (`write_results`)."""
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    yield small_cuda_models(vocab)
    write_results(name, results)


def departures(a, b) -> list[int]:
    """Per row of two `GenerateOutput`s, the first differing position of the sequences (-1 = identical)."""
    out = []
    for x, y in zip(a.sequences, b.sequences):
        diff = (x != y).nonzero()
        out.append(int(diff[0]) if len(diff) else -1)
    return out


def mean_accepted(out) -> float:
    """Draft tokens accepted per step, pooled over the rows of a `GenerateOutput`."""
    return sum(map(sum, out.accepted)) / sum(map(len, out.accepted))


def write_results(name: str, results: dict) -> None:
    """`results` as `$DFLASH2_GPU_OUT/<name>` (JSON) when that variable is set; else nothing."""
    out = os.environ.get("DFLASH2_GPU_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, name), "w") as f:
            json.dump(results, f, indent=2)
