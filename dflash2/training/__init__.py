"""Distillation of DFlash2 drafters (DESIGN.md section 4).

    data.py, regenerate.py, contamination.py   training data: target-regenerated responses, packing
    layout.py      anchors, flattened blocks, the training attention mask (dense / FlexAttention)
    losses.py      unary CE/KL + selector K-way CE, position weights, validation signals
    trainer.py     the accelerate loop (`Distiller`), target pass, metrics, eval, export
    state.py       checkpoints and exact resume;  export.py  z-lab export and warm start
    config.py      `DistillConfig` (Hydra schema of train/distill.py);  run.py  `run_distill`
"""
