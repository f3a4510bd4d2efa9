"""Distill a DFlash2 drafter from a frozen target (DESIGN.md section 4).

    python train/distill.py experiment=tiny_cpu output_dir=DIR            # 2-core CPU, < 2 minutes
    python train/distill.py experiment=smollm2_gpu output_dir=DIR
    python train/distill.py experiment=qwen3_8b output_dir=DIR data.regenerated=REGEN.jsonl
    python train/distill.py ... output_dir=DIR resume=true                # continue a killed run
    accelerate launch --num_processes 8 train/distill.py experiment=qwen3_8b output_dir=DIR
    python train/distill.py -m ... train.lr=1e-3,3e-3 output_dir=DIR       # grid: DIR/0, DIR/1, ...
    python train/distill.py experiment=ablation_qwen05b 'arms=[dflash2,conv_only,v1]' output_dir=DIR
                                            # three arms, one process, the same batches: DIR/<arm>/

Every config value is checked before any work; a refused run writes nothing and exits with
status 2 after one `error: ...` line (`DFLASH2_DEBUG=1` adds the traceback; see
`dflash2.entrypoint`). Writes DIR/.hydra/config.yaml (the resolved config), DIR/metrics.jsonl,
DIR/checkpoints/step_<n>/ and the z-lab-format export DIR/final/, then prints a summary
(final loss and tau_proxy, held-out engine tau, where the files are). `resume=true` says which
checkpoint it continues from, or that none was usable. Under `-m`, every point of the sweep
is checked (and a non-empty sweep directory refused without resume=true) before Hydra creates
the sweep directory; each point trains in its subdir. `DFLASH2_KILL_AT` is a test hook (`dflash2.killpoints`).
"""

from pathlib import Path

import hydra

from dflash2 import killpoints
from dflash2.entrypoint import config_checks, is_main_process, run_entry, user_errors
from dflash2.training.config import register_distill_schema

register_distill_schema()


@hydra.main(config_path="../configs/distill", config_name="distill", version_base=None)
@user_errors
def main(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from dflash2.training.run import distill_summary, run_distill, run_distill_arms

    with config_checks():
        killpoints.arm_from_env()   # the test hook, read once per run (unset: nothing armed)
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:   # -m: each grid point trains in its own subdir of the sweep dir
        # Interpolations of output_dir (e.g. an experiment's data.regenerated) keep the value given.
        OmegaConf.resolve(cfg)
        cfg.output_dir = hc.runtime.output_dir
    if cfg.arms:   # several arms in one process, on the same batches (dflash2.training.arms)
        finals = run_distill_arms(cfg)
        if is_main_process():
            for name, final in finals.items():
                print(f"[{name}] " + distill_summary(final.parent), flush=True)
        return
    final = run_distill(cfg)
    if is_main_process():
        print(distill_summary(final.parent), flush=True)


if __name__ == "__main__":
    from dflash2.training.run import checked_config

    run_entry(main, config_dir=Path(__file__).resolve().parent.parent / "configs/distill", config_name="distill",
              check=checked_config)
