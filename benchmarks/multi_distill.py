"""Multi-GPU distillation figures (issue 8 item 5, issue 11): the worker and the report
(docs/EXPERIMENTS.md, "Multi-GPU distillation", for the runs that make the figures).

    accelerate launch ... -m benchmarks.multi_distill run --name NAME --run-dir DIR --results RES [options]
    python -m benchmarks.multi_distill report --results RES [--out OUT/multi_gpu.md]

`run` trains with the real `Distiller.train_step` (target pass, draft forward/backward, clip,
AdamW) on a Qwen3-8B-shaped random bf16 target and a 5-layer DFlash2 draft, synthetic samples
(same generator as benchmarks/distill.py), and writes RES/NAME.rank<r>.json: the loss of every
step (summed over processes as the trainer logs it), the seconds of every step (CUDA-synchronized)
and the peak memory of that GPU. With `--resume CKPT ...` it resumes each given checkpoint in turn
(a run dir holding only a link to it) and trains `--steps` more steps from there.

`run --tiny` swaps in the tiny CPU target/draft of the tests (fp32, dense attention) so every run can be
dry-run on a CPU machine (gloo processes:
`accelerate launch --cpu --num_processes 2 -m benchmarks.multi_distill run --tiny ...`).

Needs torch (CUDA), transformers, accelerate; not hydra, datasets or wandb.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch


GRAD_ACCUM = 1


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_target(tiny: bool):
    """The Qwen3-8B-shaped random bf16 target, identical on every process (same seed, same GPU model)."""
    from transformers import AutoModelForCausalLM

    from benchmarks.distill import QWEN3_8B
    from dflash2.runconfig import TargetSpec, random_target_config
    from dflash2.target import TargetModel

    if tiny:
        from tests.training.distill_helpers import tiny_target

        return tiny_target()
    torch.manual_seed(0)
    with torch.device(torch.cuda.current_device()):
        model = AutoModelForCausalLM.from_config(random_target_config(TargetSpec(**QWEN3_8B)), dtype=torch.bfloat16)
    return TargetModel(model.eval()).requires_grad_(False)


def make_config(args, run_dir: Path, resume: bool):
    from benchmarks.distill import QWEN3_8B
    from dflash2.runconfig import DraftSpec, HardwareSpec, LoggerSpec, TargetSpec
    from dflash2.training.config import DistillConfig, TrainSpec
    from dflash2.training.data import DataSpec

    if args.tiny:
        from tests.training.distill_helpers import tiny_config

        cfg = tiny_config(run_dir, batch_size=args.batch, max_steps=args.total, checkpoint_every=10**9,
                          keep_checkpoints=0, eval_max_new_tokens=0)
        cfg.hardware.distributed, cfg.resume = args.distributed, resume
        return cfg
    return DistillConfig(
        target=TargetSpec(**QWEN3_8B),
        draft=DraftSpec(name="dflash2-5l", num_hidden_layers=5, block_size=16, mask_token_id=151669),
        data=DataSpec(name="synthetic"), logger=LoggerSpec(mode="disabled"),
        hardware=HardwareSpec(device="cuda", mixed_precision="bf16", distributed=args.distributed),
        train=TrainSpec(batch_size=args.batch, grad_accum=GRAD_ACCUM, max_steps=args.total, num_anchors=args.anchors,
                        chunk_anchors=64, checkpoint_head=True, attention="flex", checkpoint_every=10**9,
                        keep_checkpoints=0, eval_every=0, progress=False),
        output_dir=str(run_dir), resume=resume)


def train_some(d, acc, steps: int, save_at: list[int]) -> dict:
    """Run `steps` optimizer steps from `d.start_step`; returns per-step losses and seconds."""
    from dflash2.training.losses import summarize_stats

    losses, secs, first = [], [], d.start_step
    for step in range(first, min(first + steps, d.total_steps)):
        sync()
        t0 = time.perf_counter()
        parts, _, _ = d.train_step(step)
        summed = acc.reduce(parts.detach().float(), reduction="sum")
        loss = summarize_stats(summed, d.block, n_micro=acc.num_processes * GRAD_ACCUM)["loss"]   # host sync
        sync()
        secs.append(time.perf_counter() - t0)
        losses.append(loss)
        if step + 1 in save_at:
            d.save_checkpoint(step + 1)
    return {"first_step": first + 1, "losses": losses, "step_s": secs}


def cmd_run(args) -> None:
    from accelerate import Accelerator

    from benchmarks.distill import QWEN3_8B, samples
    from dflash2.training.data import TrainingData
    from dflash2.training.trainer import Distiller

    torch.backends.cuda.matmul.allow_tf32 = True
    acc = Accelerator(cpu=args.tiny, mixed_precision="no" if args.tiny else "bf16")
    target = build_target(args.tiny)
    if args.tiny:
        from tests.training.distill_helpers import synthetic_data

        data = synthetic_data(n=args.batch * args.total, heldout=0)
    else:
        data = TrainingData(samples(args.batch * args.total, args.length, QWEN3_8B["vocab_size"]), [], [], "multi")
    cuda = torch.cuda.is_available() and not args.tiny
    jobs = [(Path(args.run_dir), None)] if not args.resume else [
        (Path(args.run_dir) / f"resume{i}", Path(c)) for i, c in enumerate(args.resume)]
    out = {"name": args.name, "rank": acc.process_index, "world": acc.num_processes,
           "gpu": torch.cuda.get_device_name() if cuda else "CPU (dry run)", "torch": torch.__version__, "parts": []}
    for run_dir, ckpt in jobs:
        if ckpt is not None and acc.is_main_process:   # a run dir whose only checkpoint is a link to `ckpt`
            (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            link = run_dir / "checkpoints" / ckpt.name
            if not link.exists():
                link.symlink_to(ckpt.resolve(), target_is_directory=True)
        acc.wait_for_everyone()
        cfg = make_config(args, run_dir, resume=ckpt is not None)
        t0 = time.perf_counter()
        d = Distiller(cfg, target, None, data, run_dir, accelerator=acc)
        if ckpt is not None and d.start_step != int(ckpt.name.split("_")[1]):
            raise RuntimeError(f"resumed at step {d.start_step}, expected {ckpt.name}")
        setup_s = time.perf_counter() - t0
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        part = train_some(d, acc, args.steps, args.save_at)
        part.update(mode=d.mode, resumed_from=str(ckpt) if ckpt else None, setup_s=setup_s,
                    peak_alloc_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
                    peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
                    draft_params=sum(p.numel() for p in d.model.parameters()))   # DTensor: global numel
        out["parts"].append(part)
        print(f"[{args.name} rank {acc.process_index}] {d.mode}: steps {part['first_step']}.."
              f"{part['first_step'] + len(part['losses']) - 1}, "
              f"loss {part['losses'][0]:.4f} -> {part['losses'][-1]:.4f}, "
              f"peak {part['peak_alloc_gib']:.1f} GiB", flush=True)
        del d
        acc.free_memory()   # accelerate keeps the prepared model/optimizer (1 process, DDP) until told
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    res = Path(args.results)
    res.mkdir(parents=True, exist_ok=True)
    (res / f"{args.name}.rank{acc.process_index}.json").write_text(json.dumps(out, indent=1))
    acc.wait_for_everyone()
    acc.end_training()


# ---------------------------------------------------------------------------------------- report
def load(res: Path, name: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(res.glob(f"{name}.rank*.json"))]


def curve(runs: list[dict], part: int = 0) -> dict[int, float]:
    p = runs[0]["parts"][part]
    return {p["first_step"] + i: v for i, v in enumerate(p["losses"])}


def rel_delta(a: dict[int, float], b: dict[int, float]) -> tuple[float, int]:
    """Mean over common steps of |a - b| / |a| (a = reference), and the number of steps."""
    common = sorted(set(a) & set(b))
    if not common:
        return float("nan"), 0
    return sum(abs(a[s] - b[s]) / abs(a[s]) for s in common) / len(common), len(common)


def throughput(runs: list[dict], batch: int, warmup: int) -> float:
    secs = runs[0]["parts"][0]["step_s"][warmup:]
    return batch * len(secs) / sum(secs) if secs else float("nan")


def cmd_report(args) -> None:
    res = Path(args.results)
    meta = json.loads((res / "meta.json").read_text()) if (res / "meta.json").is_file() else {}
    batch, warmup, tol = meta.get("batch", args.batch), meta.get("warmup", args.warmup), args.tol
    runs = {n: load(res, n) for n in ("one", "ddp", "fsdp", "resume_one", "resume_ddp")}
    lines = [f"# Multi-GPU distillation ({runs['one'][0]['gpu'] if runs['one'] else 'GPU'})", "",
             f"Setting: {meta.get('setting', '?')}", "",
             "| part | figure | value | verdict |", "|---|---|---|---|"]

    def row(part, fig, val, ok=None):
        lines.append(f"| {part} | {fig} | {val} | {'' if ok is None else ('PASS' if ok else 'FAIL')} |")

    one, ddp, fsdp = runs["one"], runs["ddp"], runs["fsdp"]
    sps1 = throughput(one, batch, warmup) if one else float("nan")
    if one:
        row("a", "1 GPU: samples/s (steps after warm-up)", f"{sps1:.2f}")
    else:
        row("a", "1-GPU run", "missing (see logs)", False)
    if one and ddp:
        d, n = rel_delta(curve(one), curve(ddp))
        row("a", f"DDP 2 GPUs vs 1 GPU: mean abs(delta loss) / loss over {n} steps", f"{100 * d:.3f} %", d <= tol)
        sps2 = throughput(ddp, batch, warmup)
        row("a", "DDP 2 GPUs: samples/s", f"{sps2:.2f}")
        row("a", "scaling efficiency = samples/s(2) / (2 x samples/s(1))", f"{100 * sps2 / (2 * sps1):.1f} %")
    elif not ddp:
        row("a", "DDP run", "missing (see logs)", False)
    if fsdp:
        if one:
            d, n = rel_delta(curve(one), curve(fsdp))
            row("b", f"FSDP 2 GPUs (resumed from the 1-GPU step-{meta.get('save_one', '?')} checkpoint) "
                     f"vs 1 GPU: mean abs(delta loss) / loss over {n} steps", f"{100 * d:.3f} %", d <= tol)
        row("b", "FSDP 2 GPUs: samples/s", f"{throughput(fsdp, batch, warmup):.2f}")
    for label, rr in (("DDP", ddp), ("FSDP", fsdp)):
        for r in rr:
            p = r["parts"][0]
            row("b", f"{label} peak memory, GPU {r['rank']} (allocated / reserved)",
                f"{p['peak_alloc_gib']:.1f} / {p['peak_reserved_gib']:.1f} GiB")
    if ddp and fsdp:
        saved = max(r["parts"][0]["peak_alloc_gib"] for r in ddp) - max(r["parts"][0]["peak_alloc_gib"] for r in fsdp)
        row("b", "FSDP saves per GPU (max over GPUs, allocated)", f"{saved:.1f} GiB", saved > 0)
    if not fsdp:
        row("b", "FSDP run", "missing (see logs)", False)
    # (c) resumes: each part's steps against the 1-GPU reference curve.
    ok_all = bool(one)
    for name, label in (("resume_one", "on 1 GPU"), ("resume_ddp", "on 2 GPUs (DDP)")):
        for i, part in enumerate(runs[name][0]["parts"] if runs[name] else []):
            src = Path(part["resumed_from"])
            d, n = rel_delta(curve(one), curve(runs[name], i)) if one else (float("nan"), 0)
            ok = bool(n) and d <= tol
            ok_all &= ok
            writer = next((x for x in src.parts if x in ("one", "ddp", "fsdp")), src.parent.parent.name)
            row("c", f"{writer} checkpoint {src.name} resumed {label}: steps "
                     f"{part['first_step']}..{part['first_step'] + len(part['losses']) - 1} vs 1 GPU, mean rel. delta",
                f"{100 * d:.3f} %", ok)
    expected = meta.get("resume_parts", 0)
    found = sum(len(runs[n][0]["parts"]) for n in ("resume_one", "resume_ddp") if runs[n])
    if found < expected:
        ok_all = False
        row("c", "resume parts", f"{found} of {expected} ran (see logs)", False)
    lines += ["", f"RESUME ACROSS PROCESS COUNTS: {'PASS' if ok_all and found else 'FAIL'} "
                  f"(tolerance {100 * tol:.1f} % mean relative loss delta, bf16)"]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        Path(args.out).write_text(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--name", required=True)
    r.add_argument("--run-dir", required=True)
    r.add_argument("--results", required=True)
    r.add_argument("--distributed", default="auto", choices=["auto", "ddp", "fsdp"])
    r.add_argument("--steps", type=int, default=100, help="steps to run in this call (per resumed checkpoint)")
    r.add_argument("--total", type=int, default=100, help="train.max_steps (the LR schedule's length)")
    r.add_argument("--save-at", type=int, nargs="*", default=[])
    r.add_argument("--resume", nargs="*", default=[], help="checkpoint dirs (step_<n>) to resume in turn")
    r.add_argument("--batch", type=int, default=8, help="GLOBAL batch (samples per optimizer step)")
    r.add_argument("--length", type=int, default=512)
    r.add_argument("--anchors", type=int, default=64)
    r.add_argument("--tiny", action="store_true", help="CPU dry run: tiny target and draft of the tests")
    q = sub.add_parser("report")
    q.add_argument("--results", required=True)
    q.add_argument("--out", default=None)
    q.add_argument("--batch", type=int, default=8)
    q.add_argument("--warmup", type=int, default=5)
    q.add_argument("--tol", type=float, default=0.01)
    args = p.parse_args()
    if args.cmd == "run":
        if not torch.cuda.is_available() and not args.tiny:
            sys.exit("benchmarks.multi_distill run needs CUDA GPUs (or --tiny for a CPU dry run)")
        cmd_run(args)
    else:
        cmd_report(args)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
