"""Distillation throughput on one GPU: optimizer steps/s, samples/s, tokens/s, peak memory.

Settings (`--shape`):
- `qwen3-8b` (default): Qwen3-8B-shaped target (random bf16 weights), five-layer DFlash2 draft,
  block 16, 256 anchors per sample, 550-token samples;
- `qwen2.5-0.5b`: the Qwen2.5-Coder-0.5B shape (24 layers, hidden 896, 14 / 2 heads, V = 151936),
  the ablation's two-layer draft (selector rank 64), 128 anchors, 512-token samples.
Samples are one document each (the first 50 tokens prompt); bf16 autocast, FlexAttention, the
real `Distiller.train_step` (target pass + draft forward, chunked head + losses, backward, clip,
AdamW). Warm-up steps (compile) are excluded; the timed steps end with `torch.cuda.synchronize()`.
`--profile` runs two more steps under `torch.profiler` and writes the trainer's phases and the
heaviest ops (GPU and host time) to `$OUT/bench_distill_profile.txt`: a diagnosis, in no figure.

    python -m benchmarks.distill                         # batch sizes 4, 8, 16
    python -m benchmarks.distill --batch-sizes 8 --no-checkpoint-head --grad-ckpt
    python -m benchmarks.distill --shape qwen2.5-0.5b --batch-sizes 8 --profile
    OUT=/tmp/out python -m benchmarks.distill            # also writes $OUT/bench_distill.md/json

Needs torch (CUDA), transformers, accelerate; not hydra, datasets or wandb.
Target: >= 6 samples/s on one H200 (the single-GPU share of the published 8-GPU recipe), 4 at
the least; the measured figures are in `docs/PERFORMANCE.md`, "Distillation".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.autograd import DeviceType


from dflash2.runconfig import DraftSpec, HardwareSpec, LoggerSpec, TargetSpec, random_target_config
from dflash2.training.config import DistillConfig, TrainSpec
from dflash2.training.data import DataSpec, TrainingData

QWEN3_8B = dict(name="qwen3-8b-random", source="random", tokenizer=None, dtype="bfloat16", hidden_size=4096,
                intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, vocab_size=151936)
QWEN25_05B = dict(name="qwen2.5-0.5b-random", source="random", tokenizer=None, dtype="bfloat16",
                  architecture="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, head_dim=64, vocab_size=151936,
                  rope_theta=1000000.0, rms_norm_eps=1e-6)
# shape -> (target, draft layers, selector rank, anchors, sample length)
SHAPES = {"qwen3-8b": (QWEN3_8B, 5, 256, 256, 550), "qwen2.5-0.5b": (QWEN25_05B, 2, 64, 128, 512)}


def samples(n: int, length: int, vocab: int, prompt: int = 50) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        mask = torch.ones(length, dtype=torch.long)
        mask[:prompt] = 0
        out.append({"input_ids": torch.randint(0, vocab - 300, (length,), generator=g), "loss_mask": mask,
                    "position_ids": torch.arange(length), "doc_ids": torch.zeros(length, dtype=torch.long)})
    return out


def bench(target, bs: int, args, arms: int = 1) -> dict:
    """Steps/s of `arms` drafters trained together on the same batches (one target pass per
    step, as `dflash2.training.arms`): arm 0 DFlash2 (or --architecture), then conv-only (selector
    weight 0) and v1, cycling."""
    from accelerate import Accelerator

    from dflash2.training.trainer import Distiller

    spec, layers, rank, _, _ = SHAPES[args.shape]
    steps = args.warmup + args.steps + (2 if args.profile else 0)
    cfg = DistillConfig(
        target=TargetSpec(**spec), draft=DraftSpec(name=f"dflash2-{layers}l", architecture=args.architecture,
                                                   num_hidden_layers=layers, block_size=16, selector_rank=rank,
                                                   mask_token_id=151669),
        data=DataSpec(name="synthetic"), logger=LoggerSpec(mode="disabled"),
        hardware=HardwareSpec(device="cuda", mixed_precision="bf16"),
        train=TrainSpec(batch_size=bs, grad_accum=args.grad_accum, max_steps=steps, num_anchors=args.anchors,
                        chunk_anchors=args.chunk_anchors, checkpoint_head=args.checkpoint_head,
                        gradient_checkpointing=args.grad_ckpt, attention=args.attention, progress=False,
                        head_loss=args.head_loss, compile=args.compile, target_graphs=args.target_graphs),
        output_dir=str(args.scratch))
    data = TrainingData(samples(bs * steps, args.length, spec["vocab_size"]), [], [], "bench")
    acc = Accelerator(mixed_precision="bf16")
    variants = [(args.architecture, 1.0), ("dflash2", 0.0), ("v1", 0.0)]
    ds = []
    for i in range(arms):
        arch, alpha = variants[i % len(variants)]
        c = replace(cfg, draft=replace(cfg.draft, architecture=arch), train=replace(cfg.train, selector_alpha=alpha))
        ds.append(Distiller(c, target, None, data, args.scratch / f"arm{i}", accelerator=acc))

    def step(s):
        batches = ds[0].step_batches(s)
        return [d.train_step(s, batches) for d in ds][0]

    for s in range(args.warmup):
        step(s)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for s in range(args.warmup, args.warmup + args.steps):
        parts, _, _ = step(s)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    row = {"batch": bs, "arms": arms, "grad_accum": args.grad_accum, "steps_per_s": args.steps / dt,
           "samples_per_s": bs * args.steps / dt,
           "tokens_per_s": bs * args.length * args.steps / dt,
           "query_tokens_per_s": bs * args.anchors * 16 * args.steps / dt,
           "step_s": dt / args.steps, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
           "loss": float(parts[0])}
    if args.profile:
        row["profile"] = profile_steps(step, range(args.warmup + args.steps, steps))
    ds.clear()  # the arms go before empty_cache (`step` reads the name)
    torch.cuda.empty_cache()
    return row


def profile_steps(step_fn, steps) -> str:
    """`torch.profiler` tables of `step_fn(s)` over `steps`: the trainer's phases (`phase_table`),
    then the heaviest ops by GPU time and by host time."""
    from torch.profiler import ProfilerActivity, profile

    steps = list(steps)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in steps:
            step_fn(s)
        torch.cuda.synchronize()
    events = prof.key_averages()
    return (phase_table(events, len(steps)) + "\n"
            + events.table(sort_by="cuda_time_total", row_limit=35) + "\n"
            + events.table(sort_by="self_cpu_time_total", row_limit=25))


def phase_table(events, n_steps: int) -> str:
    """Markdown: per `distill.*` profiler range of the trainer (batch, target_pass, mask, forward,
    backward, optimizer), its calls, host ms and GPU ms per step (GPU = kernels launched inside the
    range on its thread), and the GPU time outside every range (the autograd engine's backward
    kernels, launched on its own thread, land there). `events`: `profile.key_averages()`.
    On CUDA each range also appears as a device-side user annotation spanning its kernels; those
    rows are spans, not kernels, so they are neither phases nor counted in the GPU totals."""
    def gpu(e) -> float:
        return float(getattr(e, "device_time_total", 0.0) or 0.0)

    def device_annotation(e) -> bool:
        return bool(getattr(e, "is_user_annotation", False)) and \
            getattr(e, "device_type", DeviceType.CPU) != DeviceType.CPU

    events = [e for e in events if not device_annotation(e)]
    per = max(int(n_steps), 1) * 1000.0   # us over all steps -> ms per step
    phases = sorted((e for e in events if e.key.startswith("distill.")), key=lambda e: e.key)
    total_gpu = sum(float(getattr(e, "self_device_time_total", 0.0) or 0.0) for e in events)
    lines = ["| phase | calls / step | host ms / step | GPU ms / step |", "|---|---|---|---|"]
    for e in phases:
        lines.append(f"| {e.key[len('distill.'):]} | {e.count / max(n_steps, 1):g} | {e.cpu_time_total / per:.2f} | "
                     f"{gpu(e) / per:.2f} |")
    outside = total_gpu - sum(gpu(e) for e in phases)
    lines.append(f"| outside the ranges (backward's autograd thread) | - | - | {outside / per:.2f} |")
    lines.append(f"| all | - | - | {total_gpu / per:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    p.add_argument("--batch-sizes", default=None, help="default: 4,8,16 (qwen3-8b), 8 (qwen2.5-0.5b)")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--anchors", type=int, default=None, help="default: the shape's (256 / 128)")
    p.add_argument("--length", type=int, default=None, help="default: the shape's (550 / 512)")
    p.add_argument("--architecture", default="dflash2", choices=["dflash2", "v1"])
    p.add_argument("--chunk-anchors", type=int, default=64)
    p.add_argument("--checkpoint-head", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--grad-ckpt", action="store_true", help="recompute draft layers in backward")
    p.add_argument("--attention", default="flex", choices=["flex", "dense"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--profile", action="store_true", help="profile two more steps (torch.profiler tables)")
    p.add_argument("--arms", default="1", help="drafters trained together on the same batches, e.g. 1,3")
    p.add_argument("--head-loss", default="auto", choices=["auto", "fused", "autograd"])
    p.add_argument("--compile", action="store_true", help="train.compile=true: the draft forward and losses compiled")
    p.add_argument("--target-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="train.target_graphs: the target's pass replayed from a CUDA graph")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks.distill needs a CUDA GPU")
    spec, layers, _, anchors, length = SHAPES[args.shape]
    args.anchors = args.anchors or anchors
    args.length = args.length or length
    args.batch_sizes = args.batch_sizes or ("4,8,16" if args.shape == "qwen3-8b" else "8")
    out = Path(os.environ.get("OUT", "."))
    args.scratch = out / "bench_scratch"
    torch.backends.cuda.matmul.allow_tf32 = True
    from transformers import AutoModelForCausalLM

    from dflash2.target import TargetModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(random_target_config(TargetSpec(**spec)), dtype=torch.bfloat16)
    target = TargetModel(model.eval()).requires_grad_(False)
    rows, profiles = [], []
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        for arms in [int(a) for a in args.arms.split(",")]:
            try:
                rows.append(bench(target, bs, args, arms))
            except torch.OutOfMemoryError:
                rows.append({"batch": bs, "arms": arms, "grad_accum": args.grad_accum, "error": "OOM"})
                torch.cuda.empty_cache()
            if "profile" in rows[-1]:
                profiles.append(f"## batch {bs}, {arms} arm(s)\n{rows[-1].pop('profile')}")
            print(json.dumps(rows[-1]), flush=True)
    gpu = torch.cuda.get_device_name()
    head = (f"Distillation throughput, {gpu}: {spec['name']} target (random bf16), {layers}-layer {args.architecture} "
            f"draft, block 16, {args.anchors} anchors, {args.length}-token samples, bf16 autocast, "
            f"attention={args.attention}, checkpoint_head={args.checkpoint_head}, grad_ckpt={args.grad_ckpt}, "
            f"chunk_anchors={args.chunk_anchors}, head_loss={args.head_loss}, compile={args.compile}, "
            f"target_graphs={args.target_graphs}; "
            f"{args.warmup} warm-up + {args.steps} "
            f"timed steps; arms = drafters trained together on the same batches.\n\n"
            f"Command: `python -m benchmarks.distill {' '.join(sys.argv[1:])}`\n\n")
    table = ["| batch | arms | steps/s | samples/s | tokens/s | query tokens/s | s/step | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            table.append(f"| {r['batch']} | {r['arms']} | {r['error']} | | | | | |")
        else:
            table.append(f"| {r['batch']} | {r['arms']} | {r['steps_per_s']:.2f} | {r['samples_per_s']:.2f} | "
                         f"{r['tokens_per_s']:.0f} | {r['query_tokens_per_s']:.0f} | {r['step_s']:.3f} | "
                         f"{r['peak_mem_gib']:.1f} |")
    md = head + "\n".join(table) + "\n"
    print(md)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_distill.md").write_text(md)
    (out / "bench_distill.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "gpu": gpu, "rows": rows}, indent=2))
    if profiles:
        (out / "bench_distill_profile.txt").write_text("\n".join(profiles))


if __name__ == "__main__":
    main()
