"""Distill a DFlash2 drafter from a frozen target (DESIGN.md section 4).

    python train/distill.py experiment=tiny_cpu output_dir=DIR            # 2-core CPU, < 2 minutes
    python train/distill.py experiment=smollm2_gpu output_dir=DIR
    python train/distill.py experiment=qwen3_8b output_dir=DIR data.regenerated=REGEN.jsonl
    python train/distill.py ... output_dir=DIR resume=true                # continue a killed run
    accelerate launch --num_processes 8 train/distill.py experiment=qwen3_8b output_dir=DIR

Writes DIR/metrics.jsonl, DIR/checkpoints/step_<n>/ and the z-lab-format export DIR/final/.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a fresh clone without install

import hydra  # noqa: E402

from dflash2.training.config import register_distill_schema  # noqa: E402

register_distill_schema()


@hydra.main(config_path="../configs/distill", config_name="distill", version_base=None)
def main(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from dflash2.training.run import run_distill

    # Multirun (-m): each job writes its own subdir of output_dir (hydra.sweep.subdir), as eval/run.py
    # does; interpolations of output_dir (e.g. an experiment's data.regenerated) keep the value given.
    OmegaConf.resolve(cfg)
    cfg.output_dir = HydraConfig.get().runtime.output_dir
    final = run_distill(cfg)
    print(f"final checkpoint: {final}")


if __name__ == "__main__":
    main()
