"""Tiny synthetic distillation runs for the trainer tests (and their subprocesses).

    python -m tests.training.distill_helpers OUT [key=value ...]     # one run, e.g. under SIGKILL or torchrun
    DFLASH2_KILL_AT=checkpoint_save@4 python -m tests.training.distill_helpers OUT ...   # dflash2.killpoints

The target is a random 4-layer Qwen3 with a 300-token vocabulary; the data are random packed
sequences (two documents each, prompt tokens unmasked). Labels come from the target's own
argmax, so the draft has something real to learn and the loss falls.
"""

from __future__ import annotations

import sys

import torch

from dflash2.runconfig import DraftSpec, HardwareSpec, LoggerSpec, TargetSpec
from dflash2.training.config import DistillConfig, TrainSpec
from dflash2.training.data import DataSpec, TrainingData

VOCAB = 300


def tiny_target():
    from dflash2.target import TargetModel
    from tests.conftest import tiny_qwen3

    t = TargetModel(tiny_qwen3(vocab=VOCAB, hidden=64, layers=4, seed=0))
    return t.requires_grad_(False)


def synthetic_data(n: int = 8, length: int = 48, seed: int = 0, heldout: int = 2) -> TrainingData:
    """`n` packed sequences of two documents (lengths split ~1:2), prompts of 6 tokens unmasked."""
    g = torch.Generator().manual_seed(seed)

    def sample(L: int) -> dict[str, torch.Tensor]:
        cut = L // 3
        ids = torch.randint(1, VOCAB - 1, (L,), generator=g)
        doc = torch.cat([torch.zeros(cut, dtype=torch.long), torch.ones(L - cut, dtype=torch.long)])
        pos = torch.cat([torch.arange(cut), torch.arange(L - cut)])
        mask = torch.ones(L, dtype=torch.long)
        mask[:6] = 0
        mask[cut:cut + 6] = 0
        return {"input_ids": ids, "loss_mask": mask, "position_ids": pos, "doc_ids": doc}

    train = [sample(length - (i % 3) * 4) for i in range(n)]
    held = [sample(length) for _ in range(heldout)]
    prompts = [torch.randint(1, VOCAB - 1, (8,), generator=g).tolist() for _ in range(heldout)]
    return TrainingData(train, held, prompts, format_hash="synthetic0000000")


def tiny_config(out_dir, **train) -> DistillConfig:
    tc = dict(batch_size=4, max_steps=6, lr=3e-3, warmup_ratio=0.0, num_anchors=6, chunk_anchors=4,
              checkpoint_head=False, log_every=1, checkpoint_every=3, eval_every=0, eval_prompts=2,
              eval_max_new_tokens=8, progress=False)
    tc.update(train)
    return DistillConfig(
        target=TargetSpec(name="tiny-300", vocab_size=VOCAB, tokenizer=None),
        draft=DraftSpec(name="t", num_hidden_layers=1, block_size=8, selector_rank=8, selector_top_k=4,
                        mask_token_id=VOCAB - 1),
        data=DataSpec(name="synthetic"), train=TrainSpec(**tc), logger=LoggerSpec(mode="disabled"),
        hardware=HardwareSpec(device="cpu"), output_dir=str(out_dir), experiment_name="tiny-test")


def run(out_dir, *, resume: bool = False, accelerator=None, draft=None, logger: str = "disabled", **train):
    """Build and fit a tiny run; returns the `Distiller` (after `fit`)."""
    from dflash2.runconfig import prepare_output_dir
    from dflash2.training.trainer import Distiller

    torch.manual_seed(0)
    cfg = tiny_config(out_dir, **train)
    cfg.resume = resume
    cfg.logger = LoggerSpec(mode=logger, project="dflash2-test")
    prepare_output_dir(out_dir, resume)
    d = Distiller(cfg, tiny_target(), None, synthetic_data(), out_dir, draft=draft, accelerator=accelerator)
    d.final = d.fit()
    return d


def _main(argv: list[str]) -> None:
    out, kv = argv[0], dict(a.split("=", 1) for a in argv[1:])
    resume = kv.pop("resume", "false") == "true"
    run(out, resume=resume, **{k: int(v) if v.lstrip("-").isdigit() else v for k, v in kv.items()})


if __name__ == "__main__":
    from dflash2 import killpoints

    torch.set_num_threads(1)
    killpoints.arm_from_env()   # the crash-safety tests' DFLASH2_KILL_AT (test hook)
    _main(sys.argv[1:])
