"""Distillation throughput on one GPU (issue 8, item 8): samples/s, tokens/s, peak memory.

Setting: Qwen3-8B-shaped target (random bf16 weights), five-layer DFlash2 draft, block 16,
256 anchors per sample, 550-token samples (one document each, the first 50 tokens prompt),
bf16 autocast, FlexAttention, the real `Distiller.train_step` (target pass + draft forward,
chunked head + losses, backward, clip, AdamW). Warm-up steps (compile) are excluded; the
timed steps end with `torch.cuda.synchronize()`.

    python -m benchmarks.distill                         # batch sizes 4, 8, 16
    python -m benchmarks.distill --batch-sizes 8 --no-checkpoint-head --grad-ckpt
    OUT=/tmp/out python -m benchmarks.distill            # also writes $OUT/bench_distill.md/json

Needs torch (CUDA), transformers, accelerate; not hydra, datasets or wandb.
Target: >= 6 samples/s on one H200 (the single-GPU share of the published 8-GPU recipe); the
issue is not resolved below 4 samples/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch


from dflash2.runconfig import DraftSpec, HardwareSpec, LoggerSpec, TargetSpec, random_target_config
from dflash2.training.config import DistillConfig, TrainSpec
from dflash2.training.data import DataSpec, TrainingData

QWEN3_8B = dict(name="qwen3-8b-random", source="random", tokenizer=None, dtype="bfloat16", hidden_size=4096,
                intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, vocab_size=151936)


def samples(n: int, length: int, vocab: int, prompt: int = 50) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        mask = torch.ones(length, dtype=torch.long)
        mask[:prompt] = 0
        out.append({"input_ids": torch.randint(0, vocab - 300, (length,), generator=g), "loss_mask": mask,
                    "position_ids": torch.arange(length), "doc_ids": torch.zeros(length, dtype=torch.long)})
    return out


def bench(target, bs: int, args) -> dict:
    from accelerate import Accelerator

    from dflash2.training.trainer import Distiller

    steps = args.warmup + args.steps
    cfg = DistillConfig(
        target=TargetSpec(**QWEN3_8B), draft=DraftSpec(name="dflash2-5l", num_hidden_layers=5, block_size=16,
                                                       mask_token_id=151669),
        data=DataSpec(name="synthetic"), logger=LoggerSpec(mode="disabled"),
        hardware=HardwareSpec(device="cuda", mixed_precision="bf16"),
        train=TrainSpec(batch_size=bs, grad_accum=args.grad_accum, max_steps=steps, num_anchors=args.anchors,
                        chunk_anchors=args.chunk_anchors, checkpoint_head=args.checkpoint_head,
                        gradient_checkpointing=args.grad_ckpt, attention=args.attention, progress=False),
        output_dir=str(args.scratch))
    data = TrainingData(samples(bs * steps, args.length, QWEN3_8B["vocab_size"]), [], [], "bench")
    acc = Accelerator(mixed_precision="bf16")
    d = Distiller(cfg, target, None, data, args.scratch, accelerator=acc)
    for s in range(args.warmup):
        d.train_step(s)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for s in range(args.warmup, steps):
        parts, _, _ = d.train_step(s)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    row = {"batch": bs, "grad_accum": args.grad_accum, "samples_per_s": bs * args.steps / dt,
           "tokens_per_s": bs * args.length * args.steps / dt, "query_tokens_per_s": bs * args.anchors * 16 * args.steps / dt,
           "step_s": dt / args.steps, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
           "loss": float(parts[0])}
    del d
    torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="4,8,16")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--anchors", type=int, default=256)
    p.add_argument("--length", type=int, default=550)
    p.add_argument("--chunk-anchors", type=int, default=64)
    p.add_argument("--checkpoint-head", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--grad-ckpt", action="store_true", help="recompute draft layers in backward")
    p.add_argument("--attention", default="flex", choices=["flex", "dense"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks.distill needs a CUDA GPU")
    out = Path(os.environ.get("OUT", "."))
    args.scratch = out / "bench_scratch"
    torch.backends.cuda.matmul.allow_tf32 = True
    from transformers import AutoModelForCausalLM

    from dflash2.target import TargetModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(random_target_config(TargetSpec(**QWEN3_8B)), dtype=torch.bfloat16)
    target = TargetModel(model.eval()).requires_grad_(False)
    rows = []
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        try:
            rows.append(bench(target, bs, args))
        except torch.OutOfMemoryError:
            rows.append({"batch": bs, "grad_accum": args.grad_accum, "error": "OOM"})
            torch.cuda.empty_cache()
        print(json.dumps(rows[-1]), flush=True)
    gpu = torch.cuda.get_device_name()
    head = (f"Distillation throughput, {gpu}: Qwen3-8B-shaped target (random bf16), 5-layer DFlash2 draft, "
            f"block 16, {args.anchors} anchors, {args.length}-token samples, bf16 autocast, attention={args.attention}, "
            f"checkpoint_head={args.checkpoint_head}, grad_ckpt={args.grad_ckpt}, chunk_anchors={args.chunk_anchors}; "
            f"{args.warmup} warm-up + {args.steps} timed steps.\n\n"
            f"Command: `python -m benchmarks.distill {' '.join(sys.argv[1:])}`\n\n")
    table = ["| batch | samples/s | tokens/s | query tokens/s | s/step | peak GiB |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            table.append(f"| {r['batch']} | {r['error']} | | | | |")
        else:
            table.append(f"| {r['batch']} | {r['samples_per_s']:.2f} | {r['tokens_per_s']:.0f} | "
                         f"{r['query_tokens_per_s']:.0f} | {r['step_s']:.3f} | {r['peak_mem_gib']:.1f} |")
    md = head + "\n".join(table) + "\n"
    print(md)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_distill.md").write_text(md)
    (out / "bench_distill.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                        "gpu": gpu, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
