"""Training state on disk: `DIR/checkpoints/step_<n>/` for exact resume.

Each checkpoint directory holds
    config.json + model.safetensors   the draft, z-lab format (also usable as `init_from`)
    trainer_state.pt                  optimizer, scheduler, step, data position, RNG states
    COMPLETE                          written last: a directory without it is ignored
and is written to `step_<n>.tmp` first, fsynced and renamed, so a kill mid-write never leaves a
half checkpoint that resume would pick (`torn_checkpoints` names what resume skips).
Everything is saved from the unwrapped model and rank 0's optimizer (DDP replicas are
identical), so a checkpoint written on 2 processes resumes on 1 and vice versa. Under FSDP the
trainer gathers the full model and optimizer state first and saves the same files: the optimizer
state is always the index-keyed form of `torch.optim.Optimizer.state_dict()`
(`optimizer_state_by_index` converts the name-keyed form of `torch.distributed.checkpoint.state_dict`
to it, `optimizer_state_by_name` back), so checkpoints move freely between 1 process, DDP and
FSDP. The data position needs no RNG: the batch order and anchors are functions of
(seed, epoch, index) (`dflash2.training.layout.anchor_seed`).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

STATE_NAME = "trainer_state.pt"
DONE_NAME = "COMPLETE"


def rng_state() -> dict:
    np_state = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(tuple(state["python"]) if not isinstance(state["python"], tuple) else state["python"])
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy(), *n[2:]))
    if "cuda" in state and torch.cuda.is_available():
        # A checkpoint written where a process saw another number of GPUs (2 -> 1 process with
        # CUDA_VISIBLE_DEVICES narrowed) holds one state per device it saw: restore those this
        # process has, in order (each process only draws from its own device's generator).
        saved = list(state["cuda"])
        for i in range(min(len(saved), torch.cuda.device_count())):
            torch.cuda.set_rng_state(saved[i], i)


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step_{step}"


def save_checkpoint(out_dir: Path, step: int, draft, optimizer, scheduler, extra: dict, keep: int) -> Path:
    """Write the checkpoint of `step` atomically and prune all but the newest `keep` (main process).

    The files go to `step_<n>.tmp/`, are fsynced with the directory, and the directory is renamed
    to `step_<n>/` (the parent fsynced too): a kill at any point leaves either no `step_<n>/` or a
    complete one, plus at worst a torn `.tmp` that resume skips and names (`torn_checkpoints`).

    Args:
        draft: an unsharded draft (`save_pretrained`); optimizer: an optimizer, or its full
            index-keyed state dict (already gathered under FSDP); scheduler: an LR scheduler.
    """
    from dflash2 import killpoints

    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    draft.save_pretrained(tmp)
    killpoints.reached("checkpoint_save", step)
    opt_state = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    state = {"step": step, "optimizer": opt_state, "scheduler": scheduler.state_dict(),
             "rng": rng_state(), **extra}
    torch.save(state, tmp / STATE_NAME)
    for f in tmp.iterdir():
        _fsync(f)
    (tmp / DONE_NAME).write_text(str(step))
    _fsync(tmp / DONE_NAME)
    _fsync(tmp)
    old = final.with_name(final.name + ".old")
    if final.exists():   # never the case from the trainer (it keeps an existing step); kept whole until replaced
        final.rename(old)
    tmp.rename(final)
    _fsync(final.parent)
    if old.exists():
        shutil.rmtree(old)
    if keep > 0:
        for stale in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(stale)
    return final


def _fsync(path: Path) -> None:
    """fsync a file or a directory (so a rename or a new file survives a power loss, not just a kill)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_of(path: Path) -> int | None:
    m = re.fullmatch(r"step_(\d+)", path.name)
    return int(m.group(1)) if m else None


def _problem(path: Path) -> str | None:
    """Why `path` (a `checkpoints/step_*` entry) is not a usable checkpoint, or None."""
    if not path.is_dir():
        return "not a directory"
    if _step_of(path) is None:
        return "an interrupted write (temporary directory)"
    missing = [n for n in (DONE_NAME, STATE_NAME, "config.json") if not (path / n).is_file()]
    return f"incomplete (no {', '.join(missing)})" if missing else None


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints under `out_dir/checkpoints`, oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step_*") if _problem(p) is None]
    return sorted(done, key=_step_of)


def torn_checkpoints(out_dir: Path) -> list[tuple[Path, str]]:
    """`(path, why)` for each entry under `out_dir/checkpoints` that resume cannot use (a write
    killed midway, a directory without its COMPLETE marker), sorted by name."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return [(p, why) for p in sorted(root.glob("step_*")) if (why := _problem(p)) is not None]


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def load_state(ckpt: Path) -> dict:
    """`trainer_state.pt` of a checkpoint (tensors, dicts and numbers only: `weights_only`)."""
    return torch.load(Path(ckpt) / STATE_NAME, map_location="cpu", weights_only=True)


def load_draft_weights(draft, ckpt: Path) -> None:
    """Copy a checkpoint's tensors into `draft` in place (strict names and shapes)."""
    from dflash2.checkpoint import read_tensors

    tensors = read_tensors(ckpt)
    own = draft.state_dict()
    with torch.no_grad():
        missing = sorted(set(own) - set(tensors))
        if missing:
            raise ValueError(f"checkpoint {ckpt} lacks {missing[:3]}: it was written by a different draft config")
        for name, t in own.items():
            t.copy_(tensors[name].to(t.dtype))


def optimizer_state_by_index(named: dict) -> dict:
    """The index-keyed `Optimizer.state_dict()` form of a name-keyed full optimizer state.

    Args:
        named: `{"state": {fqn: {...}}, "param_groups": [{..., "params": [fqn, ...]}]}` as
            `torch.distributed.checkpoint.state_dict.get_optimizer_state_dict` returns it.
    Returns:
        `{"state": {i: {...}}, "param_groups": [{..., "params": [i, ...]}]}`, parameters numbered
        in group order exactly as `torch.optim.Optimizer.state_dict` numbers them.
    """
    index: dict[str, int] = {}
    groups = []
    for g in named["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in g["params"]]
        group = {**g, "params": ids}
        if isinstance(group.get("betas"), list):   # the gather turns Adam's tuple into a list
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    unknown = sorted(set(named["state"]) - set(index))
    if unknown:
        raise ValueError(f"optimizer state for {unknown[:3]}, which no param group lists")
    state = {index[name]: v for name, v in sorted(named["state"].items(), key=lambda kv: index[kv[0]])}
    return {"state": state, "param_groups": groups}


def optimizer_state_by_name(indexed: dict, names: list[str]) -> dict:
    """Inverse of `optimizer_state_by_index`: `names[i]` is the name of parameter `i`.

    Raises:
        ValueError: the checkpoint's optimizer has another number of parameters than `names`
            (a different draft config or `train.freeze`).
    """
    count = sum(len(g["params"]) for g in indexed["param_groups"])
    if count != len(names):
        raise ValueError(f"the checkpoint's optimizer holds {count} parameters but this run trains {len(names)}: "
                         "it was written with another draft config or train.freeze")
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in indexed["param_groups"]]
    state = {names[int(i)]: v for i, v in indexed["state"].items()}
    return {"state": state, "param_groups": groups}
