"""Draft checkpoint IO with the z-lab tensor contract (spec 7; fixture
`shared/fixtures/zlab-dflash2/safetensors-header.json`).

A checkpoint is a directory with `config.json` and safetensors (one file, or shards listed in
`model.safetensors.index.json`). Tensor names are exactly the module paths of
`DFlash2DraftModel` (`fc.weight`, `layers.{i}.attention_conv.base_kernel`,
`candidate_selector.predecessor_codebook`, ...): no `embed_tokens`, no `lm_head`, codebooks
without a `.weight` suffix. safetensors only: pickle files are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflash2.config import DFlash2Config

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# Ports that store the codebooks as embedding weights (`.weight` suffix) load too.
_SUFFIXED_ALIASES = {
    "candidate_selector.predecessor_codebook.weight": "candidate_selector.predecessor_codebook",
    "candidate_selector.successor_codebook.weight": "candidate_selector.successor_codebook",
}


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match what its config implies."""


def _dtype_from_config(config: DFlash2Config) -> torch.dtype | None:
    dt = getattr(config, "dtype", None)
    if isinstance(dt, torch.dtype):
        return dt
    if isinstance(dt, str) and hasattr(torch, dt):
        return getattr(torch, dt)
    return None


def _weight_files(path: Path) -> list[Path]:
    if (path / INDEX_NAME).is_file():
        index = json.loads((path / INDEX_NAME).read_text())
        return sorted({path / f for f in index["weight_map"].values()})
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
    hint = f" (found pickle files {pickles}; convert them to safetensors first)" if pickles else ""
    raise FileNotFoundError(f"no *.safetensors in {path}{hint}")


def expected_tensor_shapes(config: DFlash2Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint with this config must hold."""
    from dflash2.modeling.draft import DFlash2DraftModel

    with torch.device("meta"):
        model = DFlash2DraftModel(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_tensors(config: DFlash2Config, found: dict[str, tuple[int, ...]]) -> None:
    """Raise `CheckpointMismatchError` naming the first tensor (in name order) that is missing,
    unexpected, or of the wrong shape for `config`."""
    expected = expected_tensor_shapes(config)
    arch = "DFlash2 (conv + selector)" if config.is_dflash2 else "DFlash v1 (no conv, no selector)"
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            raise CheckpointMismatchError(
                f"tensor '{name}' {list(expected[name])} is missing from the checkpoint, but the config "
                f"({arch}) requires it; check `architectures` and `num_hidden_layers` in config.json")
        if name not in expected:
            raise CheckpointMismatchError(
                f"tensor '{name}' {list(found[name])} is in the checkpoint but not in a {arch} draft with "
                f"this config; the checkpoint and config.json disagree (e.g. architecture or layer count)")
        if tuple(found[name]) != expected[name]:
            raise CheckpointMismatchError(
                f"tensor '{name}' has shape {list(found[name])} but config.json implies {list(expected[name])}; "
                "check hidden_size, intermediate_size, head counts, head_dim, vocab_size, "
                "target_layer_ids, conv_kernel_size, conv_group_size and selector_rank")


def read_tensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in _weight_files(Path(path)):
        with safe_open(str(f), framework="pt", device=str(device)) as fh:
            for name in fh.keys():
                out[_SUFFIXED_ALIASES.get(name, name)] = fh.get_tensor(name)
    return out


def load_draft(cls, path, *, dtype: torch.dtype | None = None, device=None):
    """Build `cls(config)` from a checkpoint directory with strict names and shapes."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json (a DFlash checkpoint is a directory)")
    config = DFlash2Config.from_pretrained(str(path))
    config.check()
    device = torch.device(device or "cpu")
    tensors = read_tensors(path, device)
    check_tensors(config, {k: tuple(v.shape) for k, v in tensors.items()})
    dtype = dtype or _dtype_from_config(config) or next(iter(tensors.values())).dtype
    # Build on the meta device (no throw-away init of large codebooks), then assign the tensors.
    with torch.device("meta"):
        model = cls(config)
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True, assign=True)
    # Non-persistent buffers (RoPE inverse frequencies) are not in the file: rebuild them.
    model.rotary_emb = type(model.rotary_emb)(config).to(device)
    model.config.dtype = dtype
    return model.eval()


def save_draft(model, save_directory) -> None:
    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    model.config.dtype = next(iter(state.values())).dtype
    model.config.save_pretrained(str(out))
    save_file(state, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
