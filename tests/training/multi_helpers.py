"""Tiny distillation runs with a chosen `hardware.distributed` (FSDP tests and their subprocesses).

    accelerate launch --multi_gpu --num_processes 2 -m tests.training.multi_helpers OUT distributed=fsdp [key=value ...]

(On a CPU-only machine `--multi_gpu` starts the processes through torchrun and they join a gloo
group; `--cpu` would start ONE process unless mpirun is set up.) Each process prints
`rank R of N: MODE` so a test can check that the processes really ran.

Same target, data and draft as `tests.training.distill_helpers` (whose `run` fixes the hardware);
`distributed=` goes to `hardware.distributed`, every other key to `train`.
"""

from __future__ import annotations

import os
import sys

import torch

from dflash2.runconfig import LoggerSpec
from tests.training.distill_helpers import synthetic_data, tiny_config, tiny_target


def run(out_dir, *, resume: bool = False, distributed: str = "auto", accelerator=None, **train):
    """Build and fit a tiny run under `hardware.distributed=distributed`; returns the `Distiller`."""
    from dflash2.runconfig import prepare_output_dir
    from dflash2.training.trainer import Distiller

    torch.manual_seed(0)
    cfg = tiny_config(out_dir, **train)
    cfg.resume = resume
    cfg.logger = LoggerSpec(mode="disabled")
    cfg.hardware.distributed = distributed
    # As dflash2.training.run does: only the main process checks and creates the run directory
    # (each rank doing it raced: one rank's writability probe made the directory look non-empty
    # to the other). The rank comes from the launcher's environment: creating accelerate's state
    # here, before the Distiller's `Accelerator(cpu=True)`, would set it up differently.
    if int(os.environ.get("RANK", "0")) == 0:
        prepare_output_dir(out_dir, resume)
    d = Distiller(cfg, tiny_target(), None, synthetic_data(), out_dir, accelerator=accelerator)
    d.final = d.fit()
    print(f"rank {d.acc.process_index} of {d.acc.num_processes}: {d.mode}", flush=True)
    return d


def _main(argv: list[str]) -> None:
    out, kv = argv[0], dict(a.split("=", 1) for a in argv[1:])
    resume = kv.pop("resume", "false") == "true"
    distributed = kv.pop("distributed", "auto")
    run(out, resume=resume, distributed=distributed,
        **{k: int(v) if v.lstrip("-").isdigit() else v for k, v in kv.items()})


if __name__ == "__main__":
    torch.set_num_threads(1)
    _main(sys.argv[1:])
