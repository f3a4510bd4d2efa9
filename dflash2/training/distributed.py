"""Process layouts of a distillation (`hardware.distributed`): which mode a launch runs in, and
FSDP2 sharding of the objective. The frozen target is never wrapped."""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def distributed_mode(hardware, accelerator) -> str:
    """`single`, `ddp` or `fsdp` for this launch.

    `hardware.distributed=auto` follows `accelerate launch` (FSDP when its config says FSDP, which
    it signals with ACCELERATE_USE_FSDP=true: accelerate itself has no FSDP mode on CPU, the trainer
    does); `fsdp` shards even under a plain multi-process launch; `ddp` refuses an FSDP launch
    config rather than silently ignoring one of them.
    """
    import os

    from accelerate.utils import DistributedType

    want = getattr(hardware, "distributed", "auto")
    if want not in ("auto", "ddp", "fsdp"):
        raise ValueError(f"hardware.distributed={want!r}: use auto, ddp or fsdp")
    launched_fsdp = (accelerator.distributed_type == DistributedType.FSDP
                     or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true")
    if want == "ddp" and launched_fsdp:
        raise ValueError("hardware.distributed=ddp, but accelerate was launched with an FSDP config: "
                         "drop one of them (e.g. use configs/accelerate/ddp_2gpu.yaml)")
    if accelerator.num_processes == 1:
        if want == "fsdp":
            warnings.warn("hardware.distributed=fsdp with one process: nothing to shard, training unsharded",
                          stacklevel=2)
        return "single"
    return "fsdp" if want == "fsdp" or launched_fsdp else "ddp"


def shard_objective(objective, device: torch.device, accelerator) -> bool:
    """FSDP2 in place: one `fully_shard` unit per draft decoder layer, then the objective as root
    (fc, norms, selector codebooks). Options from an accelerate FSDP config: `reshard_after_forward`
    (bool) and `activation_checkpointing`; CPU offload is refused. Returns whether the accelerate
    config asked for activation checkpointing.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    reshard, act_ckpt = True, False
    if plugin is not None:
        offload = getattr(plugin, "cpu_offload", None)
        if getattr(offload, "offload_params", False) or type(offload).__name__ == "CPUOffloadPolicy":
            raise ValueError("the accelerate FSDP config asks for CPU offload (fsdp_offload_params: true), which "
                             "the distillation trainer does not support: set it to false")
        if isinstance(getattr(plugin, "reshard_after_forward", None), bool):
            reshard = plugin.reshard_after_forward
        act_ckpt = bool(getattr(plugin, "activation_checkpointing", False))
    mesh = init_device_mesh(device.type, (accelerator.num_processes,))
    for layer in objective.draft.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(objective, mesh=mesh)
    return act_ckpt


@contextlib.contextmanager
def fsdp_no_sync(model):
    """Accumulate unreduced gradients over micro-batches (FSDP2's `no_sync`)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
