"""`run_distill(cfg)`: what `python train/distill.py ...` does, callable from Python and tests.

    checks       every config value before any work (`check_distill_config`; unknown keys such
                 as `+train.lrr=1` too): a refused run writes nothing
    output dir   refuse a non-empty one without resume=true; record the resolved config in
                 DIR/.hydra/ (`dflash2.entrypoint.write_run_config`)
    target       load (frozen), check the draft fits it
    data         data.regenerated, else regenerate into DIR/data/regenerated.jsonl (resumable),
                 then pack (dflash2.training.data)
    train        Distiller.fit(): checkpoints, metrics.jsonl, W&B, eval, DIR/final/
    summary      `distill_summary(DIR)`: the lines `train/distill.py` prints at the end

With `arms=[a, b, ...]` (`run_distill_arms`), one process trains every arm on the same batches
(`dflash2.training.arms`): one target, one data set, arm `a` in `output_dir/a/`.
"""

from __future__ import annotations

from pathlib import Path

import torch


def checked_config(cfg):
    """The `DistillConfig` of `cfg` (DictConfig or dataclass) after every check; raises
    `dflash2.entrypoint.ConfigError` naming the first bad key or value. Touches no file."""
    from dflash2.entrypoint import checked_object
    from dflash2.training.config import check_distill_config

    return checked_object(cfg, check_distill_config)


def run_distill(cfg) -> Path:
    """Run one distillation from a composed `DistillConfig`; returns `DIR/final/`."""
    from dflash2.entrypoint import write_run_config
    from dflash2.runconfig import check_output_dir, load_target, prepare_output_dir
    from dflash2.training.trainer import Distiller

    raw = cfg
    cfg = checked_config(cfg)
    out = check_output_dir(cfg.output_dir, cfg.resume, job_name="distill")   # every process, before any writes
    acc = _accelerator(cfg)
    if acc.is_main_process:
        prepare_output_dir(out, cfg.resume, job_name="distill")
        write_run_config(out, raw, job_name="distill")
    acc.wait_for_everyone()
    target, tokenizer = load_target(cfg.target, acc.device)
    data = _training_data(cfg, target, tokenizer, acc, out / "data")
    return Distiller(cfg, target, tokenizer, data, out, accelerator=acc).fit()


def run_distill_arms(cfg) -> dict[str, Path]:
    """Run the arms of a config with non-empty `arms` in one process; returns `{arm: DIR/arm/final}`.

    Every arm's config is checked and every arm directory passes the output-directory rule
    before anything is written; data regenerated here go to `output_dir/data/`."""
    from dflash2.entrypoint import write_run_config
    from dflash2.runconfig import check_output_dir, load_target, prepare_output_dir
    from dflash2.training.arms import ArmGroup, arm_configs
    from dflash2.training.trainer import Distiller

    cfg = checked_config(cfg)
    arms = arm_configs(cfg)
    outs = {name: check_output_dir(a.output_dir, cfg.resume, job_name="distill") for name, a in arms.items()}
    acc = _accelerator(cfg)
    if acc.is_main_process:
        for name, a in arms.items():
            prepare_output_dir(outs[name], cfg.resume, job_name="distill")
            write_run_config(outs[name], a, job_name="distill")
    acc.wait_for_everyone()
    target, tokenizer = load_target(cfg.target, acc.device)
    data = _training_data(cfg, target, tokenizer, acc, Path(cfg.output_dir) / "data")
    group = ArmGroup.build({name: (lambda a=a, name=name: Distiller(a, target, tokenizer, data, outs[name],
                                                                    accelerator=acc))
                            for name, a in arms.items()})
    return group.fit(progress=cfg.train.progress)


def _accelerator(cfg):
    from accelerate import Accelerator

    from dflash2.runconfig import resolve_device

    device = resolve_device(cfg.hardware)
    mp = cfg.hardware.mixed_precision if device.type == "cuda" else "no"
    return Accelerator(cpu=device.type == "cpu", mixed_precision=mp)


def _training_data(cfg, target, tokenizer, acc, data_dir: Path):
    """`data.regenerated`, else answers regenerated into `data_dir/regenerated.jsonl` (main
    process, resumable), packed into `TrainingData`."""
    from dflash2.training.data import build_training_data
    from dflash2.training.regenerate import regenerate

    source = cfg.data.regenerated
    if source is None:
        source = data_dir / "regenerated.jsonl"
        if acc.is_main_process:
            with torch.no_grad():
                regenerate(target, tokenizer, cfg.data, source, progress=cfg.train.progress,
                           target_name=cfg.target.name)
        acc.wait_for_everyone()
    return build_training_data(source, tokenizer, cfg.data)


def distill_summary(out_dir: str | Path) -> str:
    """The end-of-run summary of a distillation directory, from its files: the last training
    row's loss and tau_proxy, the held-out engine tau (`eval/tau_real`, with the held-out proxy
    and gap) when evaluated, and where the checkpoint, export and metrics are."""
    from dflash2.training.metrics import read_metrics
    from dflash2.training.state import latest_checkpoint

    out = Path(out_dir)
    metrics = out / "metrics.jsonl"
    rows = read_metrics(metrics) if metrics.is_file() else []
    train = [r for r in rows if r.get("loss") is not None]
    held = [r for r in rows if r.get("eval/tau_real") is not None or r.get("eval/tau_proxy") is not None]
    lines = ["distillation finished"]
    if train:
        last = train[-1]
        lines.append(f"  step {last['step']}: loss {_num(last.get('loss'))}, tau_proxy {_num(last.get('tau_proxy'))}")
    if held:
        h = held[-1]
        lines.append(f"  held-out at step {h['step']}: engine tau {_num(h.get('eval/tau_real'))} "
                     f"(tau_proxy {_num(h.get('eval/tau_proxy'))}, gap {_num(h.get('eval/gap'))})")
    else:
        lines.append("  held-out: not evaluated (no held-out data or train.eval_max_new_tokens=0)")
    ckpt = latest_checkpoint(out)
    lines += [f"  checkpoint: {ckpt if ckpt is not None else 'none'}",
              f"  export:     {out / 'final'}", f"  metrics:    {metrics}"]
    return "\n".join(lines)


def _num(v) -> str:
    return "n/a" if v is None else f"{float(v):.4g}"
