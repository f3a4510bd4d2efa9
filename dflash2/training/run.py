"""`run_distill(cfg)`: what `python train/distill.py ...` does, callable from Python and tests.

    output dir   refuse a non-empty one without resume=true (Hydra's own run files do not count)
    target       load (frozen), check the draft fits it
    data         data.regenerated, else regenerate into DIR/data/regenerated.jsonl (resumable),
                 then pack (dflash2.training.data)
    train        Distiller.fit(): checkpoints, metrics.jsonl, W&B, eval, DIR/final/
"""

from __future__ import annotations

from pathlib import Path

import torch


def to_config(cfg):
    """A `DistillConfig` dataclass from Hydra's DictConfig (or the dataclass itself)."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg


def run_distill(cfg) -> Path:
    """Run one distillation from a composed `DistillConfig`; returns `DIR/final/`."""
    from accelerate import Accelerator

    from dflash2.runconfig import load_target, prepare_output_dir, resolve_device
    from dflash2.training.data import build_training_data
    from dflash2.training.regenerate import regenerate
    from dflash2.training.trainer import Distiller

    cfg = to_config(cfg)
    cfg.train.check()
    device = resolve_device(cfg.hardware)
    mp = cfg.hardware.mixed_precision if device.type == "cuda" else "no"
    acc = Accelerator(cpu=device.type == "cpu", mixed_precision=mp)
    out = Path(cfg.output_dir)
    if acc.is_main_process:
        prepare_output_dir(out, cfg.resume, job_name="distill")
    acc.wait_for_everyone()
    target, tokenizer = load_target(cfg.target, acc.device)
    source = cfg.data.regenerated
    if source is None:
        source = out / "data" / "regenerated.jsonl"
        if acc.is_main_process:
            with torch.no_grad():
                regenerate(target, tokenizer, cfg.data, source, progress=cfg.train.progress,
                           target_name=cfg.target.name)
        acc.wait_for_everyone()
    data = build_training_data(source, tokenizer, cfg.data)
    return Distiller(cfg, target, tokenizer, data, out, accelerator=acc).fit()
