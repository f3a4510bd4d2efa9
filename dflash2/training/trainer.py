"""The distillation loop (DESIGN.md section 4): frozen target online, accelerate for devices.

Per optimizer step, on each process:

    samples   this rank's share of the global batch (order = permutation of (seed, epoch))
    anchors   up to A per sample, drawn from (seed, epoch, sample index)      layout.sample_anchors
    target    one no-grad forward with a block-diagonal causal mask (packed documents never see
              each other): features at target_layer_ids, final-normed last state -> teacher argmax
              (dflash2.training.teacher; replayed from a CUDA graph per batch shape on CUDA)
    draft     DistillObjective: blocks + mask (FlexAttention on CUDA, dense on CPU), chunked head,
              unary + alpha * selector loss; backward, clip, AdamW, cosine-with-warmup

Everything a step depends on is a function of (seed, step) and the saved state, so a killed run
resumed from `DIR/checkpoints/step_<n>/` reproduces the uninterrupted loss curve (bit-identical
on CPU fp32), and a 2-process run matches a 1-process run at the same global batch.

Several processes (`hardware.distributed`): DDP (accelerate wraps the objective) or FSDP2
(`fully_shard` per draft decoder layer plus one root unit for fc, norms and selector; fp32
master weights and gradient reduce-scatter, bf16 compute through the same autocast as DDP).
The frozen target is never wrapped: every process holds it whole, without gradients. Under
FSDP, checkpoints, evaluation and the export use the gathered full state, so the files are
the same as with 1 process or DDP (docs/MULTI_GPU.md).
"""

from __future__ import annotations

import contextlib
import copy
import math
import resource
import time
from pathlib import Path

import torch
from torch.profiler import record_function

from dflash2.entrypoint import UserError
from dflash2.kernels.dispatch import resolve_impl
from dflash2.training.data import TrainingData, collate
from dflash2.training.distributed import distributed_mode, fsdp_no_sync, shard_objective
from dflash2.training.layout import (anchor_seed, attention_rule, build_layout, dense_mask, flex_block_mask,
                                     sample_anchors)
from dflash2.training.losses import DistillObjective, summarize_stats
from dflash2.training.metrics import MetricsJsonl, WandbSink, console_postfix
from dflash2.training.target_cache import TargetPassCache
from dflash2.training.teacher import TeacherPass
from dflash2.training import state as st


class TrainingDivergedError(UserError, RuntimeError):
    """A loss part or the gradient became NaN/inf; the message names the step, the part and the
    fix (the entry points print it as one line)."""


class TrainingSetupError(UserError, ValueError):
    """The data or the process layout cannot make one optimizer step (too few sequences for the
    batch, a batch that does not split over the processes); one line from the entry points."""


def resume_message(out_dir: Path, ckpt: Path | None) -> str:
    """What `resume=true` found: the checkpoint and step it continues from, or that no usable
    checkpoint exists (the run starts at step 0); each torn checkpoint skipped is named."""
    lines = [f"[distill] resume: skipped {path} ({why})" for path, why in st.torn_checkpoints(out_dir)]
    if ckpt is None:
        lines.append(f"[distill] resume: no usable checkpoint in {Path(out_dir) / 'checkpoints'}: starting at step 0")
    else:
        lines.append(f"[distill] resume: continuing from step {int(ckpt.name.split('_')[1])} ({ckpt})")
    return "\n".join(lines)


def cosine_with_warmup(optimizer, warmup: int, total: int, min_ratio: float):
    """LambdaLR: linear warmup over `warmup` steps, then cosine from 1 to `min_ratio`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(warmup, 1)
        progress = (step - warmup) / max(total - warmup, 1)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def pad_to_multiple(batch: dict[str, torch.Tensor], multiple: int) -> dict[str, torch.Tensor]:
    """Pad `[B, S]` tensors on the right to a multiple of `multiple` (stable shapes for compiled
    FlexAttention); padding follows `collate` (ids 0, masks 0, doc -1)."""
    S = batch["input_ids"].shape[1]
    extra = (-S) % max(multiple, 1)
    if not extra:
        return batch
    fill = {"doc_ids": -1}
    return {k: torch.nn.functional.pad(v, (0, extra), value=fill.get(k, 0)) for k, v in batch.items()}


class Distiller:
    """One distillation run. `fit()` trains, checkpoints, evaluates and exports `DIR/final/`.

    Args:
        cfg: `DistillConfig` (or an object with the same fields).
        target, tokenizer: the frozen `TargetModel` and its tokenizer.
        data: `TrainingData` (packed train sequences, held-out sequences and prompts, format hash).
        out_dir: the run directory (already checked by `prepare_output_dir`).
        draft: optional prebuilt draft (else `init_from` or a new one from `cfg.draft`).
        accelerator: optional `accelerate.Accelerator` (else one is made from `cfg.hardware`).
    """

    def __init__(self, cfg, target, tokenizer, data: TrainingData, out_dir, *, draft=None, accelerator=None):
        from accelerate import Accelerator

        from dflash2.runconfig import new_draft, resolve_device
        from dflash2.training.export import warm_start

        self.cfg, self.tc = cfg, cfg.train
        self.tc.check()
        self.target, self.tokenizer, self.data = target, tokenizer, data
        self.out_dir = Path(out_dir)
        device = resolve_device(cfg.hardware)
        if accelerator is None:
            mp = cfg.hardware.mixed_precision if device.type == "cuda" else "no"
            accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=mp)
        self.acc = accelerator
        self.device = accelerator.device
        self.mode = distributed_mode(cfg.hardware, accelerator)
        self.fsdp = self.mode == "fsdp"
        if draft is None:
            if cfg.init_from:
                draft = warm_start(cfg.init_from, cfg.draft.architecture, cfg.draft)
            else:
                draft = new_draft(cfg.draft, target, tokenizer, seed=self.tc.seed)
        target.check_compatible(draft.config)   # vocab / hidden / layer ids vs this target
        # FSDP: the main process keeps an unsharded CPU copy that receives the gathered full
        # state for checkpoints, evaluation and the export (`_full_draft`).
        self._mirror, self._mirror_at = None, -1
        if self.fsdp and accelerator.is_main_process:
            self._mirror = copy.deepcopy(draft.float()).cpu().requires_grad_(False)
        self.draft = draft.float().to(self.device).train()
        self.draft.layer_checkpointing = bool(self.tc.gradient_checkpointing)
        if self.tc.freeze == "backbone":
            if not draft.config.is_dflash2:
                raise ValueError("train.freeze=backbone trains only conv + selector, which a v1 draft does not have")
            for name, p in self.draft.named_parameters():
                p.requires_grad_(any(k in name for k in ("attention_conv", "mlp_conv", "candidate_selector")))
        self.layer_ids = list(draft.config.target_layer_ids)
        self.block = draft.block_size

        n = len(data.train)
        self.world = accelerator.num_processes
        if self.tc.batch_size % (self.world * self.tc.grad_accum):
            raise TrainingSetupError(f"train.batch_size={self.tc.batch_size} must divide into {self.world} "
                                     f"processes x train.grad_accum={self.tc.grad_accum} micro-batches")
        self.micro = self.tc.batch_size // (self.world * self.tc.grad_accum)
        self.steps_per_epoch = n // self.tc.batch_size
        if self.steps_per_epoch == 0:
            raise TrainingSetupError(f"{n} training sequences is fewer than train.batch_size="
                                     f"{self.tc.batch_size}; lower the batch size or add data (answers "
                                     f"already regenerated in {out_dir} are reused with resume=true)")
        self.total_steps = self.tc.max_steps or self.tc.epochs * self.steps_per_epoch

        self.start_step, resume_state = 0, None
        ckpt = st.latest_checkpoint(self.out_dir) if cfg.resume else None
        if cfg.resume and accelerator.is_main_process:
            print(resume_message(self.out_dir, ckpt), flush=True)
        if ckpt is not None:   # full weights into the unsharded draft, on every process
            st.load_draft_weights(self.draft, ckpt)
            resume_state = st.load_state(ckpt)
            self.start_step = int(resume_state["step"])
        # The fused head loss's row kernel, resolved once for this device (Triton on CUDA).
        self.kernel_impl = resolve_impl("auto", self.device)
        objective = DistillObjective(self.draft, self.tc.objective(), self.kernel_impl).to(self.device)
        if self.fsdp and shard_objective(objective, self.device, accelerator):
            self.draft.layer_checkpointing = True
        if self.tc.compile:
            if self.fsdp:
                raise UserError("train.compile=true with FSDP: the sharded objective runs eagerly; drop one")
            objective.compile_forward()
        # After sharding, the parameters are the sharded DTensors the optimizer must own.
        params = [p for p in (objective if self.fsdp else self.draft).parameters() if p.requires_grad]
        names = {id(p): n for n, p in objective.named_parameters()}
        self.param_names = [names[id(p)] for p in params]          # optimizer index -> "draft.<fqn>"
        # CUDA: the fused AdamW (one launch per step; its rounding may differ from the foreach
        # update in the last bit). CPU keeps the default implementation.
        opt = torch.optim.AdamW(params, lr=self.tc.lr, betas=tuple(self.tc.adam_betas),
                                weight_decay=self.tc.weight_decay,
                                fused=True if self.device.type == "cuda" and not self.fsdp else None)
        self.scheduler = cosine_with_warmup(opt, int(self.tc.warmup_ratio * self.total_steps), self.total_steps,
                                            self.tc.min_lr_ratio)
        if self.fsdp:
            # accelerate's own FSDP preparation is not used (it exists only for GPUs and would
            # re-wrap): the sharded objective and a plain optimizer, same loop otherwise.
            self.model, self.optimizer = objective, opt
        else:
            self.model, self.optimizer = accelerator.prepare(objective, opt)
        if resume_state is not None:
            if self.fsdp:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

                named = st.optimizer_state_by_name(resume_state["optimizer"], self.param_names)
                set_optimizer_state_dict(self.model, self.optimizer, named,
                                         options=StateDictOptions(full_state_dict=True))
            else:
                self.optimizer.load_state_dict(resume_state["optimizer"])
            self.scheduler.load_state_dict(resume_state["scheduler"])
            st.set_rng_state(resume_state["rng"])
        self.params = params
        self._unchecked: list[tuple[int, torch.Tensor]] = []   # (step, [loss parts, grad norm]) not yet read
        self.attention = self.tc.attention if self.tc.attention != "auto" else (
            "flex" if self.device.type == "cuda" else "dense")
        if self.attention == "flex" and self.device.type != "cuda":
            raise ValueError("train.attention=flex needs CUDA (PyTorch has no FlexAttention backward on CPU); "
                             "use train.attention=auto or dense here")
        self.pad_to = self.tc.pad_to or (256 if self.device.type == "cuda" else 1)
        # The target's pass: held in CUDA graphs on CUDA (`train.target_graphs`), per sequence
        # and eager with the target cache.
        self.teacher = TeacherPass(self.target, self.layer_ids, keep_last=self.tc.loss == "kl",
                                   graphs=self.tc.target_graphs and self.device.type == "cuda"
                                   and not self.tc.cache_target)
        self.target_cache = TargetPassCache(self.teacher.eager, self.device) if self.tc.cache_target else None
        if self.attention == "flex" and self.device.type == "cuda":
            import torch._dynamo as dynamo

            # One compiled FlexAttention per padded length: allow more than the default 8.
            for knob in ("cache_size_limit", "recompile_limit"):
                if hasattr(dynamo.config, knob):
                    setattr(dynamo.config, knob, max(64, getattr(dynamo.config, knob)))

    # ------------------------------------------------------------------ data
    def _rank_indices(self, step: int) -> tuple[int, list[int]]:
        """(epoch, this rank's sample indices) of optimizer step `step` (0-based)."""
        epoch, b = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(anchor_seed(self.tc.seed, epoch, -1))
        order = torch.randperm(len(self.data.train), generator=g)
        gb = order[b * self.tc.batch_size:(b + 1) * self.tc.batch_size].tolist()
        per_rank = self.tc.batch_size // self.world
        r = self.acc.process_index
        return epoch, gb[r * per_rank:(r + 1) * per_rank]

    def make_batch(self, samples: list[dict], keys: list[tuple[int, int]]) -> tuple[dict, object]:
        """Device batch (target outputs + layout) and its attention mask for `samples`, whose anchors
        are drawn from `keys` = [(epoch, index)] per sample."""
        A = self.tc.num_anchors
        with record_function("distill.batch"):   # profiler ranges (benchmarks.distill --profile)
            anchors, valid = zip(*(sample_anchors(s["loss_mask"], s["doc_ids"], A,
                                                  torch.Generator().manual_seed(anchor_seed(self.tc.seed, e, i)))
                                   for s, (e, i) in zip(samples, keys)))
            batch = pad_to_multiple(collate(samples), self.pad_to)
            batch = {k: self._to_device(v) for k, v in batch.items()}
            anchors, valid = self._to_device(torch.stack(anchors)), self._to_device(torch.stack(valid))
            lay = build_layout(batch["input_ids"], batch["loss_mask"], batch["position_ids"], batch["doc_ids"],
                               anchors, valid, self.block, self.draft.config.mask_token_id)
        with record_function("distill.target_pass"):
            if self.target_cache is not None:
                # Held-out batches use epoch -1 and index their own list: key by (split, index).
                tgt = self.target_cache.outputs([(e < 0, i) for e, i in keys], samples, batch["input_ids"].shape[1])
            else:
                tgt = self.teacher(batch)
            if self.acc.mixed_precision == "no":   # fp32 draft without autocast: feed it fp32
                tgt = {k: (v.float() if v.is_floating_point() else v) for k, v in tgt.items()}
        with record_function("distill.mask"):
            if self.attention == "flex":
                mask = flex_block_mask(lay, batch["doc_ids"], batch["position_ids"], self.draft.config,
                                       compile=self.device.type == "cuda")
            else:
                mask = dense_mask(lay, batch["doc_ids"], batch["position_ids"], self.draft.config)
        out = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], **tgt,
               "block_ids": lay.block_ids, "block_pos": lay.block_pos, "data_idx": lay.data_idx,
               "label_mask": lay.label_mask, "pred_ids": lay.pred_ids, "anchor_valid": lay.anchor_valid,
               "_tokens": int(sum(int(s["input_ids"].numel()) for s in samples))}
        return out, mask

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host tensor to the device; on CUDA through pinned memory without blocking the host, so
        the next step's batch is prepared while the device still runs this one."""
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        return self.target.head(h.to(self.target.dtype) if not torch.is_autocast_enabled(h.device.type) else h)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.target.embed(ids)
        return e if self.acc.mixed_precision != "no" else e.float()

    # ------------------------------------------------------------------ one step
    def step_batches(self, step: int) -> list[tuple[dict, object, int]]:
        """This rank's micro-batches of optimizer step `step`: `(device batch, attention mask,
        tokens)` each (`make_batch`). A function of (seed, step) and the data alone, so arms
        with the same `batch_key` can share them (`dflash2.training.arms`)."""
        epoch, idx = self._rank_indices(step)
        out = []
        for j in range(0, len(idx), self.micro):
            mb = idx[j:j + self.micro]
            batch, mask = self.make_batch([self.data.train[i] for i in mb], [(epoch, i) for i in mb])
            out.append((batch, mask, batch.pop("_tokens")))
        return out

    def batch_key(self) -> tuple:
        """Everything `step_batches` depends on besides the data: equal keys, equal batches."""
        cfg = self.draft.config
        return (self.tc.seed, self.tc.batch_size, self.tc.grad_accum, self.tc.num_anchors, self.tc.epochs,
                self.tc.loss, self.block, int(cfg.mask_token_id), tuple(self.layer_ids), self.pad_to,
                self.attention, self.acc.mixed_precision, attention_rule(cfg), self.tc.cache_target)

    def train_step(self, step: int, batches: list[tuple[dict, object, int]] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Forward/backward over this rank's micro-batches (`batches`, else `step_batches(step)`),
        clip, optimizer and scheduler step. Returns `(parts summed over micro-batches, grad
        norm, tokens)` as device tensors, with no host sync: a NaN/inf is raised by
        `check_finite` at the next log, checkpoint, evaluation or the end, before anything
        computed after it is written."""
        batches = self.step_batches(step) if batches is None else batches
        self.model.train()
        parts, tokens = None, 0
        for j, (batch, mask, n_tokens) in enumerate(batches):
            tokens += n_tokens
            sync = (contextlib.nullcontext() if j == len(batches) - 1 else
                    fsdp_no_sync(self.model) if self.fsdp else self.acc.no_sync(self.model))
            with sync:
                with self.acc.autocast(), record_function("distill.forward"):
                    loss, p = self.model(batch, mask, self._embed, self._head, self.target.lm_head_weight)
                with record_function("distill.backward"):
                    self.acc.backward(loss / len(batches))
            parts = p if parts is None else parts + p
        with record_function("distill.optimizer"):
            if self.fsdp:   # DTensor-aware in torch; the norm comes back as a replicated DTensor
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.tc.grad_clip)
                grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            else:
                grad_norm = self.acc.clip_grad_norm_(self.params, self.tc.grad_clip)
            grad_norm = grad_norm.detach().float()
            self._unchecked.append((step + 1, torch.cat([parts[:3].float(), grad_norm.reshape(1)])))
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        return parts, grad_norm, tokens

    def check_finite(self) -> None:
        """Raise `TrainingDivergedError` for the first step since the last check whose loss parts
        or gradient norm were NaN/inf (one host sync for all of them)."""
        if not self._unchecked:
            return
        steps = [s for s, _ in self._unchecked]
        vals = torch.stack([v for _, v in self._unchecked]).cpu().tolist()
        self._unchecked = []
        for step, row in zip(steps, vals):
            for name, v in zip(("total", "unary", "selector", "gradient norm"), row):
                if name != "total" and not math.isfinite(v):
                    last = st.latest_checkpoint(self.out_dir)
                    raise TrainingDivergedError(
                        f"non-finite {name} ({v}) at step {step}: training stopped; last good checkpoint: "
                        f"{last or 'none yet'} (nothing computed at or after step {step} was written). "
                        "Lower train.lr, check the data, or resume from that checkpoint.")

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, step: int, full_draft=None) -> dict[str, float]:
        """Held-out proxy metrics (training forward, no grad) and real tau from the engine.

        Args:
            step: the optimizer step evaluated (for the caller's logs).
            full_draft: under FSDP, the gathered unsharded draft (`_full_draft`, main process);
                None evaluates the live model (1 process, DDP).
        """
        from dflash2.engine import release_decode_state, speculative_generate
        from dflash2.runconfig import stop_token_ids

        live = self.draft
        if full_draft is None:
            objective = self.acc.unwrap_model(self.model)
        else:
            live = full_draft.to(self.device)
            objective = DistillObjective(live, self.tc.objective(), self.kernel_impl).to(self.device)
        was = objective.training
        objective.eval()
        out: dict[str, float] = {}
        held = self.data.heldout
        if held:
            parts = None
            for j in range(0, len(held), max(self.micro, 1)):
                sub = list(range(j, min(j + max(self.micro, 1), len(held))))
                batch, mask = self.make_batch([held[i] for i in sub], [(-1, i) for i in sub])
                batch.pop("_tokens")
                with self.acc.autocast():
                    _, p = objective(batch, mask, self._embed, self._head, self.target.lm_head_weight)
                parts = p if parts is None else parts + p
            proxy = summarize_stats(parts, self.block, n_micro=1)
            out.update({"eval/tau_proxy": proxy["tau_proxy"], "eval/path_tau": proxy["path_tau"],
                        "eval/recall_at_k": proxy["recall_at_k"]})
        prompts = self.data.heldout_prompts[: self.tc.eval_prompts]
        if prompts and self.tc.eval_max_new_tokens > 0:
            draft = live
            if draft.dtype != self.target.dtype:
                draft = copy.deepcopy(draft).to(self.target.dtype)
            draft.eval()
            res = speculative_generate(self.target, draft, [torch.tensor(p) for p in prompts],
                                       max_new_tokens=self.tc.eval_max_new_tokens,
                                       stop_token_ids=stop_token_ids(self.tokenizer) if self.tokenizer else None)
            # The engine keeps its decoding state (K/V buffers, graphs, a reference to the draft) on
            # the target for a next call; training needs that memory back.
            release_decode_state(self.target)
            stats = res.stats()
            out["eval/tau_real"] = float(stats["tau_pooled"])
            if "eval/tau_proxy" in out:
                out["eval/gap"] = out["eval/tau_proxy"] - out["eval/tau_real"]
        objective.train(was)
        live.train(was)
        if full_draft is not None:
            full_draft.cpu()
        return out

    # ------------------------------------------------------------------ loop
    def fit(self) -> Path:
        """Train from `start_step` to `total_steps`; returns `DIR/final/`."""
        self.open_run(progress=self.tc.progress)
        try:
            for step in range(self.start_step, self.total_steps):
                lr = self.scheduler.get_last_lr()[0]
                self.after_step(step, lr, *self.train_step(step))
            return self.finish_run()
        finally:
            self.close_run()

    def open_run(self, *, progress: bool) -> None:
        """The run's sinks (metrics.jsonl, W&B) and, with `progress`, its progress bar."""
        from tqdm.auto import tqdm

        main = self.acc.is_main_process
        tc = self.tc
        if main and self.world > 1:
            print(f"[distill] {self.world} processes, {self.mode}: {self.micro} samples x {tc.grad_accum} "
                  f"micro-batches per process = global batch {tc.batch_size}", flush=True)
        self._sink = self._jsonl = None
        if main:
            self._jsonl = MetricsJsonl(self.out_dir / "metrics.jsonl", self.start_step if self.cfg.resume else None)
            self._sink = WandbSink(self.cfg.logger, self.out_dir, _plain(self.cfg), self.cfg.experiment_name)
        self._bar = tqdm(total=self.total_steps, initial=self.start_step, disable=not (main and progress),
                         desc="distill", dynamic_ncols=True)
        self._window, self._win_steps, self._win_tokens, self._t0 = None, 0, 0, time.perf_counter()
        self.last_row: dict | None = None   # the latest logged training row
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def after_step(self, step: int, lr: float, parts: torch.Tensor, gnorm: torch.Tensor, tokens: int) -> None:
        """Bookkeeping of optimizer step `step` (0-based) taken at learning rate `lr`: the
        logged row every `log_every` steps, evaluation and checkpoints on their schedules."""
        tc, main = self.tc, self.acc.is_main_process
        self._window = parts if self._window is None else self._window + parts
        self._win_steps, self._win_tokens = self._win_steps + 1, self._win_tokens + tokens
        done = step + 1
        if done % tc.log_every == 0 or done == self.total_steps:
            self.check_finite()
            summed = self.acc.reduce(self._window.to(self.device), reduction="sum")
            tok = int(self.acc.reduce(torch.tensor([self._win_tokens], device=self.device), reduction="sum").item())
            dt = time.perf_counter() - self._t0
            row = {"step": done, "epoch": step // self.steps_per_epoch, "lr": lr,
                   **summarize_stats(summed, self.block, n_micro=self._win_steps * self.world * tc.grad_accum),
                   "grad_norm": float(gnorm), "steps_per_s": self._win_steps / dt,
                   "samples_per_s": self._win_steps * tc.batch_size / dt,
                   "tokens_per_s": tok / dt, "peak_mem_gb": _peak_mem_gb(self.device)}
            self.last_row = row
            if main:
                self._jsonl.write(row)
                self._sink.log(row, done)
                self._bar.set_postfix(console_postfix(row))
            self._window, self._win_steps, self._win_tokens, self._t0 = None, 0, 0, time.perf_counter()
        self._bar.update(1)
        if tc.eval_every and done % tc.eval_every == 0 and done != self.total_steps:
            self.check_finite()
            self._eval_and_log(done, main, self._jsonl, self._sink)
        if done % tc.checkpoint_every == 0 and done != self.total_steps:
            self.check_finite()
            self.save_checkpoint(done)

    def finish_run(self) -> Path:
        """The last checkpoint, the export `DIR/final/`, then the held-out evaluation."""
        from dflash2.training.export import export_final

        self.check_finite()
        main = self.acc.is_main_process
        final = self.out_dir / "final"
        self.save_checkpoint(self.total_steps)
        draft = self._full_draft()   # FSDP: gathered at the save above, no new collective
        if main:
            dtype = getattr(torch, self.tc.export_dtype) if self.tc.export_dtype else self.target.dtype
            export_final(draft, final, self._export_info(), dtype=dtype)
        self.acc.wait_for_everyone()
        # The held-out evaluation comes after the export: a run killed while evaluating (a
        # time limit on a shared machine) still leaves its final checkpoint.
        self._eval_and_log(self.total_steps, main, self._jsonl, self._sink)
        return final

    def close_run(self) -> None:
        self._bar.close()
        if self._sink is not None:
            self._sink.finish()

    def _eval_and_log(self, step: int, main: bool, jsonl, sink) -> None:
        full = self._full_draft() if self.fsdp else None    # collective: every process gathers
        if main:
            row = {"step": step, **self.evaluate(step, full)}
            if len(row) > 1:
                jsonl.write(row)
                sink.log(row, step)
        self.acc.wait_for_everyone()

    def save_checkpoint(self, step: int) -> None:
        """Write `DIR/checkpoints/step_<step>/` (collective: every process calls it; the main process
        writes the full state, gathered first under FSDP). An existing checkpoint of that step is kept."""
        self.acc.wait_for_everyone()
        draft, optimizer = self.draft, self.optimizer
        if self.fsdp:   # collectives: every process takes part, the main process gets the full state
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            draft = self._full_draft()
            named = get_optimizer_state_dict(self.model, self.optimizer,
                                             options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            optimizer = st.optimizer_state_by_index(named) if self.acc.is_main_process else None
        if self.acc.is_main_process and not st.checkpoint_dir(self.out_dir, step).exists():
            st.save_checkpoint(self.out_dir, step, draft, optimizer, self.scheduler,
                               {"epoch": step // self.steps_per_epoch, "index": step % self.steps_per_epoch},
                               self.tc.keep_checkpoints)
        self.acc.wait_for_everyone()

    def _full_draft(self):
        """The unsharded draft with the current weights: the live one (1 process, DDP), or under
        FSDP the main process's CPU copy refreshed from the gathered full state (a collective that
        every process must call; other processes get None). Gathers once per optimizer step."""
        if not self.fsdp:
            return self.draft
        done = self.scheduler.last_epoch       # optimizer steps taken (restored on resume)
        if self._mirror_at != done:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self._mirror is not None:
                prefix = "draft."
                self._mirror.load_state_dict({k[len(prefix):]: v for k, v in full.items() if k.startswith(prefix)})
            self._mirror_at = done
        return self._mirror

    def _export_info(self) -> dict:
        return {"format_hash": self.data.format_hash, "steps": self.total_steps,
                "data": getattr(self.cfg.data, "name", None), "experiment": self.cfg.experiment_name,
                "target": getattr(self.cfg.target, "name", None), "loss": self.tc.loss,
                "predecessor": self.tc.predecessor, "selector_alpha": self.tc.selector_alpha}


def _peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # Linux: KiB -> GiB


def _plain(cfg) -> dict:
    try:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    except Exception:   # a plain dataclass built in tests without OmegaConf support
        from dataclasses import asdict, is_dataclass

        return asdict(cfg) if is_dataclass(cfg) else {}
