"""Training state on disk: `DIR/checkpoints/step_<n>/` for exact resume.

Each checkpoint directory holds
    config.json + model.safetensors   the draft, z-lab format (also usable as `init_from`)
    trainer_state.pt                  optimizer, scheduler, step, data position, RNG states
    COMPLETE                          written last: a directory without it is ignored
and is written to `step_<n>.tmp` first and renamed, so a kill mid-write never leaves a
half checkpoint that resume would pick. Everything is saved from the unwrapped model and
rank 0's optimizer (DDP replicas are identical), so a checkpoint written on 2 processes
resumes on 1 and vice versa. The data position needs no RNG: the batch order and anchors
are functions of (seed, epoch, index) (`dflash2.training.layout.anchor_seed`).
"""

from __future__ import annotations

import random
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
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    return Path(out_dir) / "checkpoints" / f"step_{step}"


def save_checkpoint(out_dir: Path, step: int, draft, optimizer, scheduler, extra: dict, keep: int) -> Path:
    """Write the checkpoint of `step` atomically and prune all but the newest `keep` (main process)."""
    final = checkpoint_dir(out_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    draft.save_pretrained(tmp)
    state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": rng_state(), **extra}
    torch.save(state, tmp / STATE_NAME)
    (tmp / DONE_NAME).write_text(str(step))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    if keep > 0:
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old)
    return final


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints under `out_dir/checkpoints`, oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and (p / DONE_NAME).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("_")[1]))


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
