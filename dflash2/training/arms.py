"""Several drafters (arms) distilled in one process on the same batches.

    python train/distill.py experiment=ablation_qwen05b 'arms=[dflash2,conv_only,v1]' output_dir=ROOT/train

Each name in `arms` is a preset of the `ablation_arm` group (`configs/distill/ablation_arm/<name>.yaml`),
merged over the run's config to give that arm's own `DistillConfig`, written to `output_dir/<name>/`
exactly as `train/distill.py ablation_arm=<name> output_dir=output_dir/<name>` would write it.

Per optimizer step the batch (anchors, layout, attention mask, the frozen target's features and
teacher tokens) is built once and every arm trains on it; each arm keeps its own draft, optimizer,
scheduler, RNG stream, metrics.jsonl, W&B run, checkpoints and export. Guarantees:
- an arm's checkpoints and export are the ones it would get trained alone with the same config
  (bitwise where its training is deterministic, as on CPU): batches are a function of (seed,
  step) and the data alone (`Distiller.batch_key` must agree across arms, checked before work),
  and each arm's global RNG state is swapped in around its own work;
- `resume=true` continues each arm from its own latest checkpoint (arms may stand at different
  steps after a kill: a step's batch is built while any arm still needs it); an arm whose last
  checkpoint and export exist is left as it is (its held-out evaluation is not run again).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dflash2.training import state as st


def arm_preset(name: str) -> Path:
    """`configs/distill/ablation_arm/<name>.yaml`; `ValueError` listing the presets if absent."""
    from dflash2.runconfig import configs_dir

    folder = configs_dir() / "distill" / "ablation_arm"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ValueError(f"arms: {name!r} is not an ablation_arm preset (configs/distill/ablation_arm/: {known})")
    return path


def arm_configs(cfg) -> dict[str, object]:
    """`{arm name: its DistillConfig}` for the typed config `cfg` with a non-empty `cfg.arms`:
    the arm's preset merged over `cfg`, `output_dir/<name>`, `arms` emptied. Raises `ValueError`
    for an unknown or repeated name, or a preset that sets keys outside `draft` and `train`."""
    from omegaconf import OmegaConf

    names = list(cfg.arms)
    if len(set(names)) != len(names):
        raise ValueError(f"arms={names}: each arm at most once")
    out = {}
    for name in names:
        preset = OmegaConf.load(arm_preset(name))
        extra = set(preset.keys()) - {"draft", "train"}
        if extra:
            raise ValueError(f"arms: preset {name!r} sets {sorted(extra)}; an arm may only change draft.* and train.*")
        base = OmegaConf.structured(replace(cfg, arms=[]))
        merged = OmegaConf.to_object(OmegaConf.merge(base, preset))
        merged.output_dir = str(Path(cfg.output_dir) / name)
        # One W&B run per arm, grouped by the experiment.
        merged.logger.name = f"{cfg.logger.name or cfg.experiment_name or 'distill'}-{name}"
        merged.logger.group = cfg.logger.group or cfg.experiment_name
        out[name] = merged
    return out


class ArmGroup:
    """Train `distillers` (`{name: Distiller}`, built on one target, data and accelerator) step
    by step on shared batches. `fit()` returns `{name: DIR/final}`.

    Raises `ValueError` before any step when the arms' batches would differ (`batch_key`) or
    their step counts do.
    """

    @classmethod
    def build(cls, makers: dict[str, object]) -> ArmGroup:
        """Construct each arm with `makers[name]()` from the same global RNG state (the one a run
        of that arm alone would construct it from) and keep the state each construction leaves."""
        start = st.rng_state()
        distillers, rngs = {}, {}
        for name, make in makers.items():
            st.set_rng_state(start)
            distillers[name] = make()
            rngs[name] = st.rng_state()
        return cls(distillers, rngs)

    def __init__(self, distillers: dict[str, object], rng_states: dict[str, dict] | None = None):
        if not distillers:
            raise ValueError("ArmGroup needs at least one arm")
        self.arms = dict(distillers)
        first_name, first = next(iter(self.arms.items()))
        first_key = first.batch_key()
        for name, d in self.arms.items():
            if d.data is not first.data or d.target is not first.target:
                raise ValueError(f"arm {name}: every arm must share the target and the data object")
            key = d.batch_key()
            if key != first_key:
                diff = [i for i, (a, b) in enumerate(zip(key, first_key)) if a != b]
                raise ValueError(f"arms {first_name} and {name} would train on different batches (batch key fields "
                                 f"{diff} differ: seed, batch, anchors, block size, mask token, target layers, "
                                 "...); give them the same values")
            if d.total_steps != first.total_steps:
                raise ValueError(f"arms {first_name} and {name} differ in steps ({first.total_steps} vs "
                                 f"{d.total_steps}); give them the same train.max_steps")
        self.total_steps = first.total_steps
        # One target pass for every arm, its held-out batches included: on CUDA one set of graphs
        # (and their memory pool) instead of one per arm. Equal batch keys make the passes equal.
        for d in self.arms.values():
            d.teacher = first.teacher
        # Each arm's global RNG stream, swapped in around its own work (as if it ran alone).
        self._rng = dict(rng_states) if rng_states else {name: st.rng_state() for name in self.arms}

    def _as(self, name: str, fn, *args):
        st.set_rng_state(self._rng[name])
        try:
            return fn(*args)
        finally:
            self._rng[name] = st.rng_state()

    @staticmethod
    def _finished(d) -> bool:
        """Resumed at its last step with its export written: nothing left to do."""
        return d.start_step == d.total_steps and (d.out_dir / "final" / "model.safetensors").is_file()

    def fit(self, *, progress: bool = True) -> dict[str, Path]:
        from tqdm.auto import tqdm

        arms = self.arms
        first = next(iter(arms.values()))
        start = min(d.start_step for d in arms.values())
        for name, d in arms.items():
            self._as(name, lambda d=d: d.open_run(progress=False))
        bar = tqdm(total=self.total_steps, initial=start, desc=f"distill {len(arms)} arms", dynamic_ncols=True,
                   disable=not (progress and first.acc.is_main_process))
        try:
            for step in range(start, self.total_steps):
                batches = first.step_batches(step)
                for name, d in arms.items():
                    if step >= d.start_step:
                        lr = d.scheduler.get_last_lr()[0]
                        self._as(name, lambda d=d, lr=lr: d.after_step(step, lr, *d.train_step(step, batches)))
                bar.update(1)
                if (step + 1) % first.tc.log_every == 0:
                    bar.set_postfix({f"{name} loss": f"{d.last_row['loss']:.3g}" for name, d in arms.items()
                                     if d.last_row})
            return {name: (d.out_dir / "final" if self._finished(d) else self._as(name, d.finish_run))
                    for name, d in arms.items()}
        finally:
            bar.close()
            for d in arms.values():
                d.close_run()
