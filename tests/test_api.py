"""Public API (DESIGN.md section 2): names importable from `dflash2`, the z-lab-style wrapper."""

from __future__ import annotations

import pytest
import torch

import dflash2
from dflash2 import DFlash2Config, DFlash2DraftModel, TargetModel, speculative_generate
from tests.conftest import randomize_, tiny_draft_config, tiny_qwen3


def test_public_names():
    assert {"DFlash2Config", "DFlash2DraftModel", "TargetModel", "speculative_generate"} <= set(dflash2.__all__)
    assert DFlash2Config is DFlash2DraftModel.config_class


def test_the_records_layer_imports_no_model_code():
    """`eval/report.py --same-tokens` compares two JSONL files: importing the package, its records
    layer and the run comparison loads neither torch, transformers nor the model code (the public
    names and `init_shard`'s torch load on use)."""
    import subprocess
    import sys

    code = ("import sys, dflash2.evaluation.analysis.records, dflash2.evaluation.running.sharding; "
            "print(sorted(m for m in ('torch', 'transformers', 'dflash2.config', 'dflash2.modeling', "
            "'dflash2.engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        dflash2.Nope  # noqa: B018


def test_spec_generate_wrapper_equals_autoregressive():
    target = TargetModel(tiny_qwen3().double())
    draft = randomize_(DFlash2DraftModel(tiny_draft_config()), seed=5, std=0.05).double().eval()
    prompt = torch.tensor([[3, 17, 42, 8, 99]])
    out = draft.spec_generate(target=target, input_ids=prompt, max_new_tokens=12, temperature=0.0)
    ar = speculative_generate(target, None, prompt, max_new_tokens=12)
    assert out.num_speculative_tokens == draft.block_size - 1
    assert torch.equal(out.sequences[0], ar.sequences[0]) and len(ar.sequences[0]) == 5 + 12
