"""End to end on the real SmolLM2-135M-Instruct (offline GGUF, fp32, CPU): the target writes
answers to a few GSM8K-train prompts, a DFlash2 drafter is distilled on them inside the test,
and greedy speculative decoding with that checkpoint reproduces autoregressive decoding token
for token.

The drafter is trained and tested on the same prompts on purpose: the point is a checkpoint that
really accepts (asserted first: at least one accepted draft token per step on average), so the
equality with AR exercises multi-token commits, not a draft that is always rejected.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from dflash2 import DFlash2DraftModel, speculative_generate
from dflash2.runconfig import DraftSpec, HardwareSpec, LoggerSpec, TargetSpec, configs_dir, stop_token_ids
from dflash2.training.config import DistillConfig, TrainSpec
from dflash2.training.data import DataSpec, read_jsonl
from dflash2.training.run import run_distill

pytestmark = pytest.mark.slow


def test_distilled_drafter_on_the_real_135m_target_is_lossless(tmp_path):
    pytest.importorskip("gguf")
    target_spec = TargetSpec(**OmegaConf.to_container(OmegaConf.load(configs_dir() / "target" / "smollm2-135m.yaml")))
    cfg = DistillConfig(
        target=target_spec,
        draft=DraftSpec(name="dflash2-1l", num_hidden_layers=1, block_size=8, selector_rank=16, selector_top_k=8),
        data=DataSpec(name="gsm8k-train", source="gsm8k", limit=6, heldout=1, max_new_tokens=40,
                      regen_batch_size=6, max_seq_len=256, pack=False),
        train=TrainSpec(seed=0, batch_size=5, max_steps=100, lr=5e-3, warmup_ratio=0.05, num_anchors=16,
                        chunk_anchors=16, checkpoint_head=False, cache_target=True, log_every=20,
                        checkpoint_every=1000, eval_every=0, eval_prompts=1, eval_max_new_tokens=8, progress=False),
        logger=LoggerSpec(mode="disabled"), hardware=HardwareSpec(device="cpu"),
        output_dir=str(tmp_path / "run"), experiment_name="real-135m-test")
    torch.manual_seed(0)
    final = run_distill(cfg)

    from dflash2.runconfig import load_target

    target, tok = load_target(target_spec)
    draft = DFlash2DraftModel.from_pretrained(final).float().eval()
    rows = read_jsonl(tmp_path / "run" / "data" / "regenerated.jsonl")
    prompts = [torch.tensor(r["prompt_ids"]) for r in rows]
    kw = dict(max_new_tokens=40, stop_token_ids=stop_token_ids(tok))
    spec = speculative_generate(target, draft, prompts, num_speculative_tokens=7, **kw)
    steps = sum(len(a) for a in spec.accepted)
    mean_accepted = sum(sum(a) for a in spec.accepted) / steps
    print(f"mean accepted draft tokens per step: {mean_accepted:.2f}")
    assert mean_accepted >= 1.0, f"the distilled drafter accepts only {mean_accepted:.2f} tokens per step"
    ar = speculative_generate(target, None, prompts, **kw)
    assert [s.tolist() for s in spec.sequences] == [s.tolist() for s in ar.sequences]
    # The regenerated answers are the target's own greedy tokens: AR reproduces them.
    assert [s[len(p):].tolist() for s, p in zip(ar.sequences, prompts)] == [r["response_ids"] for r in rows]
