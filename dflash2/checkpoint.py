"""Draft checkpoint IO with the z-lab tensor contract (spec 7; fixture
`shared/fixtures/zlab-dflash2/safetensors-header.json`).

A checkpoint is a directory with `config.json` and safetensors (one file, or shards listed in
`model.safetensors.index.json`). Tensor names are exactly the module paths of
`DFlash2DraftModel` (`fc.weight`, `layers.{i}.attention_conv.base_kernel`,
`candidate_selector.predecessor_codebook`, ...): no `embed_tokens`, no `lm_head`, codebooks
without a `.weight` suffix. safetensors only: pickle files are refused.

The contract is written out here as data (`expected_tensor_shapes`), so this module needs only
the config and the model imports it, not the other way round; loading with
`load_state_dict(strict=True)` then proves that the model and the contract agree.

Loading checks everything before building the model, so a bad checkpoint raises and nothing
half-loaded is returned: unreadable, truncated or corrupted files, non-floating or non-finite
tensors, and directories that hold more than one checkpoint each name the file at fault.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dflash2.config import DFlash2Config, DFlash2ConfigError

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# Ports that store the codebooks as embedding weights (`.weight` suffix) load too.
_SUFFIXED_ALIASES = {
    "candidate_selector.predecessor_codebook.weight": "candidate_selector.predecessor_codebook",
    "candidate_selector.successor_codebook.weight": "candidate_selector.successor_codebook",
}


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match what its config implies."""


class CheckpointFileError(ValueError):
    """A checkpoint file is unreadable, truncated, corrupted, holds non-floating or non-finite
    tensors, or sits beside another checkpoint; the message names the file and the fix."""


def _dtype_from_config(config: DFlash2Config) -> torch.dtype | None:
    # `config.check()` has already refused non-floating dtype names.
    dt = getattr(config, "dtype", None)
    if isinstance(dt, torch.dtype):
        return dt
    if isinstance(dt, str) and isinstance(getattr(torch, dt.removeprefix("torch."), None), torch.dtype):
        return getattr(torch, dt.removeprefix("torch."))
    return None


def _read_index(path: Path) -> dict[str, str]:
    """`weight_map` (tensor name -> shard file name) of `model.safetensors.index.json`."""
    index_file = path / INDEX_NAME
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointFileError(f"{index_file}: not a safetensors index ({type(e).__name__}: {e}). Fix: "
                                  "restore it (it maps every tensor name to its shard under 'weight_map')") from e
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointFileError(f"{index_file}: 'weight_map' must map tensor names to shard file names")
    return weight_map


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files of the one checkpoint in `path`; a second checkpoint is an error,
    because merging two sets of tensors would silently mix their weights."""
    present = sorted(path.glob("*.safetensors"))
    if (path / INDEX_NAME).is_file():
        files = sorted({path / f for f in _read_index(path).values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointFileError(f"{path / INDEX_NAME} lists shards {missing} that are not in {path}. Fix: "
                                      "copy the missing shards (or re-download the checkpoint)")
        stray = [f.name for f in present if f not in files]
        if stray:
            raise CheckpointFileError(
                f"{path} holds {stray} besides the shards listed in {INDEX_NAME}: two checkpoints in one "
                "directory. Fix: keep one checkpoint per directory (move the other files out)")
        return files
    if len(present) > 1:
        raise CheckpointFileError(
            f"{path} holds {len(present)} safetensors files {[f.name for f in present]} but no {INDEX_NAME}, so "
            f"they are not the shards of one checkpoint. Fix: keep one checkpoint per directory ({WEIGHTS_NAME}, "
            "or shards with their index)")
    if present:
        return present
    pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
    hint = f" (found pickle files {pickles}; convert them to safetensors first)" if pickles else ""
    raise FileNotFoundError(f"no *.safetensors in {path}{hint}")


def expected_tensor_shapes(config: DFlash2Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint with this config must hold (the z-lab
    contract: `DFlash2DraftModel`'s state dict, without the non-persistent RoPE buffers)."""
    H, inter, V, hd = config.hidden_size, config.intermediate_size, config.vocab_size, config.head_dim
    nh, nkv = config.num_attention_heads, config.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (H, len(config.target_layer_ids) * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    projections = {"q_proj": (nh * hd, H), "k_proj": (nkv * hd, H), "v_proj": (nkv * hd, H), "o_proj": (H, nh * hd)}
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}."
        for name, shape in projections.items():
            shapes[f"{p}self_attn.{name}.weight"] = shape
            if config.attention_bias:
                shapes[f"{p}self_attn.{name}.bias"] = shape[:1]
        shapes.update({f"{p}self_attn.q_norm.weight": (hd,), f"{p}self_attn.k_norm.weight": (hd,),
                       f"{p}mlp.gate_proj.weight": (inter, H), f"{p}mlp.up_proj.weight": (inter, H),
                       f"{p}mlp.down_proj.weight": (H, inter), f"{p}input_layernorm.weight": (H,),
                       f"{p}post_attention_layernorm.weight": (H,)})
        if config.is_dflash2:
            K, G = config.conv_kernel_size, H // config.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                shapes[f"{p}{conv}.base_kernel"] = (2, K, H)
                shapes[f"{p}{conv}.kernel_projection.weight"] = (2 * K * G, H)
    if config.is_dflash2:
        R = config.selector_rank
        shapes.update({"candidate_selector.hidden_projection.weight": (R, H),
                       "candidate_selector.predecessor_codebook": (V, R),
                       "candidate_selector.successor_codebook": (V, R)})
    return shapes


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


def _read_file(f: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file, or a `CheckpointFileError` naming the file."""
    fix = "re-download or re-export the checkpoint"
    try:
        with safe_open(str(f), framework="pt", device=str(device)) as fh:
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointFileError(f"{f}: not a readable safetensors file, it is truncated or corrupted "
                                  f"({f.stat().st_size} bytes; safetensors says: {e}). Fix: {fix}") from e
    for name, t in tensors.items():
        if not t.is_floating_point():
            raise CheckpointFileError(
                f"{f}: tensor '{name}' has dtype {t.dtype}; draft weights are floating point (bf16/fp16/fp32). "
                "Fix: export unquantized floating-point weights")
        if not bool(torch.isfinite(t).all()):
            raise CheckpointFileError(f"{f}: tensor '{name}' contains NaN or inf (a corrupted file or a diverged "
                                      f"run). Fix: {fix}, or export an earlier training step")
    return tensors


def read_tensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in `path` (codebook aliases renamed); each name must come
    from exactly one file, and from the shard the index names for it."""
    return {name: t for name, (t, _) in _walk_weight_files(path, lambda f: _read_file(f, device)).items()}


def _walk_weight_files(path: Path, entries_of) -> dict[str, tuple[object, Path]]:
    """`{name: (entry, file)}` over the checkpoint's weight files, `entries_of(file)` giving
    `{stored name: entry}` (tensors, or header shapes); codebook aliases renamed. Raises
    `CheckpointFileError` when the index and the shards disagree, a name is stored twice, or the
    index lists a tensor no shard holds."""
    path = Path(path)
    weight_map = _read_index(path) if (path / INDEX_NAME).is_file() else None
    out: dict[str, tuple[object, Path]] = {}
    for f in _weight_files(path):
        for raw_name, entry in entries_of(f).items():
            # Shards and index must describe the same checkpoint, tensor by tensor.
            if weight_map is not None and weight_map.get(raw_name) != f.name:
                raise CheckpointFileError(
                    f"{f}: holds tensor '{raw_name}', which {INDEX_NAME} places in {weight_map.get(raw_name)!r}: "
                    "the shards and the index belong to different checkpoints. Fix: re-download the checkpoint")
            name = _SUFFIXED_ALIASES.get(raw_name, raw_name)
            if name in out:
                raise CheckpointFileError(f"tensor '{name}' is stored twice, in {out[name][1]} and in {f}: two "
                                          "checkpoints in one directory. Fix: keep one checkpoint per directory")
            out[name] = (entry, f)
    if weight_map is not None:
        absent = sorted(n for n in weight_map if _SUFFIXED_ALIASES.get(n, n) not in out)
        if absent:
            raise CheckpointFileError(f"{path / INDEX_NAME} lists tensors {absent[:3]} that no shard holds. "
                                      "Fix: re-download the checkpoint")
    return out


def read_config(path: str | Path) -> DFlash2Config:
    """The checked `DFlash2Config` of the checkpoint directory `path` (its `config.json` alone).

    Raises:
        FileNotFoundError: no `config.json`.
        DFlash2ConfigError: not a JSON object, or a field out of range (named, with the fix).
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json (a DFlash checkpoint is a directory)")
    try:
        raw = json.loads((path / "config.json").read_text())
    except ValueError as e:
        raise DFlash2ConfigError(f"{path / 'config.json'}: not valid JSON ({e}). Fix: restore the file "
                                 "(it is the draft's config, written by save_pretrained)") from e
    if not isinstance(raw, dict):
        raise DFlash2ConfigError(f"{path / 'config.json'}: holds a {type(raw).__name__}, not a JSON object. "
                                 "Fix: restore the file")
    config = DFlash2Config.from_pretrained(str(path))
    config.check()
    return config


# safetensors dtype names of floating-point tensors (draft weights are floating point).
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_MAX_HEADER = 100_000_000   # the limit safetensors itself enforces on the JSON header
_TORCH_NAMES = {"I8": "int8", "U8": "uint8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
                "I64": "int64", "U64": "uint64", "BOOL": "bool"}   # as loading names them (torch.<name>)


def read_header(f: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """`{tensor name: (dtype, shape)}` of one safetensors file, from its header alone (no tensor
    data is read), after checking that the file is exactly as long as its header says.

    Raises:
        CheckpointFileError: the header is unreadable, or the file is truncated or has trailing
            bytes, or a tensor is not floating point; the message names the file and the fix.
    """
    fix = "Fix: re-download or re-export the checkpoint"
    size = f.stat().st_size

    def bad(why: str) -> CheckpointFileError:
        return CheckpointFileError(f"{f}: not a readable safetensors file, it is truncated or corrupted "
                                   f"({size} bytes; {why}). {fix}")

    with open(f, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(_MAX_HEADER, size - 8):
            raise bad("no header length in its first 8 bytes" if n < 0 else f"its header claims {n} bytes")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, ValueError) as e:
            raise bad(f"its header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    out, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (_, stop) = str(info["dtype"]), tuple(int(d) for d in info["shape"]), info["data_offsets"]
            end = max(end, int(stop))
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"tensor '{name}' has no dtype, shape and data_offsets ({type(e).__name__})") from e
        if dtype not in _FLOAT_DTYPES:
            shown = f"torch.{_TORCH_NAMES[dtype]}" if dtype in _TORCH_NAMES else dtype
            raise CheckpointFileError(
                f"{f}: tensor '{name}' has dtype {shown}; draft weights are floating point (bf16/fp16/fp32). "
                "Fix: export unquantized floating-point weights")
        out[name] = (dtype, shape)
    if size != 8 + n + end:
        raise bad(f"its header describes {8 + n + end} bytes")
    return out


def inspect_checkpoint(path: str | Path) -> DFlash2Config:
    """Check a checkpoint directory from its metadata alone and return its config: `config.json`,
    the weight files (present, one checkpoint per directory, index and shards agreeing), each
    file's header and length, and every tensor's name and shape against the config. Reads no
    tensor data (non-finite values are found when the weights load, by `read_tensors`).

    Raises:
        FileNotFoundError, DFlash2ConfigError, CheckpointFileError, CheckpointMismatchError: the
            first problem, naming the file and the fix.
    """
    path = Path(path)
    config = read_config(path)
    headers = _walk_weight_files(path, read_header)
    shapes = {name: shape for name, ((_, shape), _) in headers.items()}
    check_tensors(config, shapes)
    return config


def load_draft(cls, path, *, dtype: torch.dtype | None = None, device=None):
    """Build `cls(config)` from a checkpoint directory with strict names and shapes.

    Every check (config fields, files, tensor names, shapes, dtypes, values) runs before the
    model is built, so an error never leaves a half-loaded model behind.
    """
    path = Path(path)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype={dtype!r}: draft weights load as a floating torch dtype. "
                         "Fix: pass torch.bfloat16, torch.float16 or torch.float32 (or None: the checkpoint's)")
    config = read_config(path)
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


def umask_file_mode() -> int:
    """The mode a new regular file gets under this process's umask (0o644 under 0o022), as
    `open(path, "w")` would create it."""
    try:   # Linux: read it without changing it (os.umask sets it, racing other threads' writes)
        with open("/proc/self/status") as f:
            umask = next(int(ln.split()[1], 8) for ln in f if ln.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def save_draft(model, save_directory) -> None:
    """Write `config.json` and `model.safetensors` (the z-lab contract) into `save_directory`.

    Both files get the umask's mode, like any file the user writes: safetensors writes the
    weights through an owner-only (0o600) temporary file and renames it, which would leave the
    checkpoint unreadable to another user or a serving process."""
    out = Path(save_directory)
    out.mkdir(parents=True, exist_ok=True)
    others = [f.name for f in out.glob("*.safetensors") if f.name != WEIGHTS_NAME]
    if others or (out / INDEX_NAME).is_file():
        # Writing beside them would leave two checkpoints in one directory, which loading refuses.
        raise CheckpointFileError(f"{out} already holds another checkpoint ({others or [INDEX_NAME]}). "
                                  "Fix: save into an empty directory, or remove those files first")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    model.config.dtype = next(iter(state.values())).dtype
    model.config.save_pretrained(str(out))
    save_file(state, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    os.chmod(out / WEIGHTS_NAME, umask_file_mode())
