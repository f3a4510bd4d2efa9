"""`DistillConfig`: the structured Hydra schema of `train/distill.py` (typos fail with the field name).

Groups: `target/`, `draft/`, `logger/`, `hardware/` are shared (`dflash2.runconfig`); `data/`,
`train/` and `experiment/` live under `configs/distill/`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dflash2.runconfig import DraftSpec, HardwareSpec, LoggerSpec, TargetSpec, existing_path
from dflash2.training.data import DataSpec
from dflash2.training.losses import ObjectiveSpec


@dataclass
class TrainSpec:
    """Optimization, objective and bookkeeping of one distillation run.

    `batch_size` is GLOBAL (samples per optimizer step over all processes and micro-batches):
    each process takes `batch_size / num_processes` samples in `grad_accum` micro-batches, so a
    run on 1 or N processes sees the same samples per step.
    """

    name: str = "default"
    seed: int = 0
    batch_size: int = 4
    grad_accum: int = 1
    epochs: int = 1
    max_steps: int | None = None          # None: epochs * (samples // batch_size)
    lr: float = 6e-4
    min_lr_ratio: float = 0.0             # cosine floor as a fraction of lr
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    num_anchors: int = 512
    # Objective (see dflash2.training.losses for the spec-11 decisions).
    loss: str = "ce"                      # ce | kl
    gamma: float | None = None            # None: 7 for block 16 (5 for 10, 4 for 8)
    selector_alpha: float = 1.0
    selector_stop_grad: bool = False
    predecessor: str = "data"             # data | self
    codebooks: str = "free"               # free [V, R] tables (the checkpoint's form)
    freeze: str = "none"                  # none | backbone (train only conv + selector)
    # Memory / speed.
    chunk_anchors: int = 64
    checkpoint_head: bool = True          # autograd head loss only
    head_loss: str = "auto"               # auto | fused | autograd (dflash2.training.losses)
    gradient_checkpointing: bool = False
    attention: str = "auto"               # auto (flex on CUDA, dense on CPU) | flex | dense
    pad_to: int = 0                       # pad S to a multiple (0: 256 on CUDA, 1 on CPU)
    compile: bool = False                 # torch.compile the draft's training forward and losses (Inductor)
    target_graphs: bool = True            # CUDA: the target's pass replayed from CUDA graphs (same bits)
    # Bookkeeping.
    log_every: int = 1
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    eval_every: int = 0                   # 0: only at the end
    eval_prompts: int = 8
    eval_max_new_tokens: int = 64
    export_dtype: str | None = None       # None: the target's dtype
    cache_target: bool = False            # run the frozen target once per sequence and reuse its outputs
                                          # (small datasets on CPU: the target pass dominates the step)
    progress: bool = True

    def objective(self) -> ObjectiveSpec:
        return ObjectiveSpec(loss=self.loss, gamma=self.gamma, selector_alpha=self.selector_alpha,
                             selector_stop_grad=self.selector_stop_grad, predecessor=self.predecessor,
                             chunk_anchors=self.chunk_anchors, checkpoint_head=self.checkpoint_head,
                             head_loss=self.head_loss)

    def check(self) -> None:
        """Raise `ValueError` naming the first `train.*` field out of range (types are Hydra's)."""
        self.objective().check()
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError(f"train.batch_size={self.batch_size}, train.grad_accum={self.grad_accum}: use >= 1")
        _need(math.isfinite(self.lr) and self.lr > 0, f"train.lr={self.lr}: use a learning rate > 0")
        _need(0.0 <= self.min_lr_ratio <= 1.0, f"train.min_lr_ratio={self.min_lr_ratio}: use a fraction in [0, 1]")
        _need(0.0 <= self.warmup_ratio < 1.0, f"train.warmup_ratio={self.warmup_ratio}: use a fraction in [0, 1)")
        _need(self.weight_decay >= 0, f"train.weight_decay={self.weight_decay}: use >= 0")
        _need(len(self.adam_betas) == 2 and all(0.0 <= b < 1.0 for b in self.adam_betas),
              f"train.adam_betas={list(self.adam_betas)}: use two values in [0, 1), e.g. [0.9, 0.95]")
        _need(self.grad_clip > 0, f"train.grad_clip={self.grad_clip}: use a gradient-norm limit > 0")
        _need(self.epochs >= 1, f"train.epochs={self.epochs}: use >= 1")
        _need(self.max_steps is None or self.max_steps >= 1,
              f"train.max_steps={self.max_steps}: use >= 1, or null for epochs x (samples // batch_size)")
        for name in ("chunk_anchors", "log_every", "checkpoint_every"):
            _need(getattr(self, name) >= 1, f"train.{name}={getattr(self, name)}: use >= 1")
        for name in ("keep_checkpoints", "eval_every", "eval_prompts", "eval_max_new_tokens", "pad_to"):
            _need(getattr(self, name) >= 0, f"train.{name}={getattr(self, name)}: use >= 0")
        _need(self.export_dtype in (None, "float32", "bfloat16", "float16"),
              f"train.export_dtype={self.export_dtype!r}: use float32, bfloat16, float16, or null for the target's")
        if self.codebooks != "free":
            raise ValueError(f"train.codebooks={self.codebooks!r}: only free [V, R] codebooks are implemented")
        if self.freeze not in ("none", "backbone"):
            raise ValueError(f"train.freeze={self.freeze!r}: use none or backbone (train only conv + selector)")
        if self.attention not in ("auto", "flex", "dense"):
            raise ValueError(f"train.attention={self.attention!r}: use auto, flex or dense")
        if self.num_anchors < 1:
            raise ValueError(f"train.num_anchors={self.num_anchors}: use >= 1")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_data_spec(spec: DataSpec) -> None:
    """Raise `ValueError` naming the first `data.*` field out of range (before any loading)."""
    from dflash2.training.data import SOURCES

    _need(spec.source in SOURCES, f"data.source={spec.source!r} is unknown; use one of {', '.join(SOURCES)}")
    _need(spec.source not in ("jsonl", "hub") or spec.regenerated is not None or bool(spec.path),
          f"data.source={spec.source} needs data.path (a JSONL file or a hub dataset)")
    _need(spec.limit is None or spec.limit >= 1, f"data.limit={spec.limit}: use >= 1, or null for all")
    for name in ("max_new_tokens", "regen_batch_size", "max_seq_len"):
        _need(getattr(spec, name) >= 1, f"data.{name}={getattr(spec, name)}: use >= 1")
    _need(spec.heldout >= 0, f"data.heldout={spec.heldout}: use >= 0")
    _need(spec.regenerated is None or existing_path(spec.regenerated),
          f"data.regenerated={spec.regenerated}: no such file (make one with train/regenerate.py)")


def check_distill_config(cfg: DistillConfig) -> None:
    """Every range check of a distillation config, before any work (the shared groups, `data`,
    `train`, `init_from`). Raises `ValueError` naming the field."""
    from dflash2.runconfig import check_shared_specs

    check_shared_specs(cfg)
    check_data_spec(cfg.data)
    _need(cfg.data.limit is None or cfg.data.heldout < cfg.data.limit,
          f"data.heldout={cfg.data.heldout} with data.limit={cfg.data.limit} leaves no training conversations; "
          "use data.heldout < data.limit")
    cfg.train.check()
    _need(cfg.init_from is None or existing_path(cfg.init_from, directory=True),
          f"init_from={cfg.init_from}: no such checkpoint directory")
    # From the target's and the checkpoint's configs alone (no weights): `dflash2.preflight`.
    from dflash2.preflight import check_draft_fits, check_draft_spec_fits, checkpoint_config, target_shapes

    shapes = target_shapes(cfg.target)
    check_draft_spec_fits(cfg.draft, shapes, cfg.target.name)
    if cfg.init_from is not None:
        check_draft_fits(checkpoint_config(cfg.init_from, "init_from"), shapes, f"init_from={cfg.init_from}",
                         cfg.target.name)
    if cfg.arms:
        from dflash2.training.arms import arm_configs

        for arm in arm_configs(cfg).values():   # each arm's merged config passes the same checks
            check_shared_specs(arm)
            arm.train.check()
            check_draft_spec_fits(arm.draft, shapes, cfg.target.name)


@dataclass
class DistillConfig:
    target: TargetSpec = field(default_factory=TargetSpec)
    draft: DraftSpec = field(default_factory=DraftSpec)
    data: DataSpec = field(default_factory=DataSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    logger: LoggerSpec = field(default_factory=LoggerSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    output_dir: str = "outputs/distill"
    resume: bool = False
    init_from: str | None = None          # a v1 or v2 z-lab checkpoint dir to warm-start from
    experiment_name: str | None = None    # set by experiment files, recorded in the export and W&B
    arms: list[str] = field(default_factory=list)   # ablation_arm presets trained together (training.arms)


def register_distill_schema() -> None:
    """Store the schema as `distill_schema` (the first entry of `configs/distill/distill.yaml`)
    and the typed `train`/`data` nodes their groups merge into."""
    from hydra.core.config_store import ConfigStore

    from dflash2.runconfig import register_shared_groups

    register_shared_groups()
    cs = ConfigStore.instance()
    cs.store(name="distill_schema", node=DistillConfig)
