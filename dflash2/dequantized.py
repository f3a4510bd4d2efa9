"""A GGUF target's dequantized copy, written once beside the GGUF and loaded by later runs.

Loading a GGUF dequantizes every tensor on the host (about a minute for Qwen2.5-Coder-1.5B on
one core) and parses its tokenizer from the metadata (about 10-20 s), in every process. With
`target.dequantized_cache=true` the first run writes

    <gguf>.<dtype>/    model.safetensors, config.json, generation_config.json, the tokenizer
                       and its chat template (`save_pretrained`), and `dequantized.json`

and every later run loads that directory (seconds). Contract:
- **Same model.** Before the copy is published it is reloaded and compared with what the GGUF
  gave: every tensor bit-equal, the same vocabulary, special tokens and chat template. A copy
  that differs is never published (`DequantizedCopyError`, nothing left behind).
- **Current.** `dequantized.json` records the GGUF's size and modification time; a GGUF that
  changed since is converted again.
- **One writer.** Processes that start together wait on a lock file while one of them writes;
  the copy appears by an atomic rename, so a reader never sees half a copy.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from dflash2.assets import file_stamp

MARKER = "dequantized.json"


class DequantizedCopyError(RuntimeError):
    """The reloaded copy differs from the GGUF it was made from."""


def copy_dir(gguf: Path, dtype: torch.dtype) -> Path:
    """Where the copy of `gguf` in `dtype` lives: `<gguf>.<dtype name>` beside it."""
    return gguf.with_name(f"{gguf.name}.{str(dtype).removeprefix('torch.')}")


def _stamp(gguf: Path) -> dict:
    return {"gguf": gguf.name, **file_stamp(gguf)}


def is_current(gguf: Path, dtype: torch.dtype) -> bool:
    """Whether a published copy of this very GGUF (same size and modification time) exists."""
    marker = copy_dir(gguf, dtype) / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return all(recorded.get(k) == v for k, v in _stamp(gguf).items()) and recorded.get("dtype") == str(dtype)


def _same_tokenizer(a, b) -> bool:
    return (a.get_vocab() == b.get_vocab() and a.all_special_tokens == b.all_special_tokens
            and a.eos_token_id == b.eos_token_id and a.pad_token_id == b.pad_token_id
            and a.chat_template == b.chat_template)


def verify(out: Path, dtype: torch.dtype, state: dict, tokenizer) -> None:
    """Raise `DequantizedCopyError` unless the copy in `out` reloads to exactly `state` (every
    tensor bit-equal) and to the same tokenizer (vocabulary, special tokens, chat template)."""
    from transformers import AutoTokenizer

    from dflash2.target import TargetModel

    reloaded = TargetModel.from_pretrained(out, dtype=dtype).model.state_dict()
    if sorted(reloaded) != sorted(state) or any(not torch.equal(state[k], reloaded[k]) for k in state):
        raise DequantizedCopyError(f"the dequantized copy in {out} does not reload to the same tensors")
    if not _same_tokenizer(tokenizer, AutoTokenizer.from_pretrained(str(out))):
        raise DequantizedCopyError(f"the tokenizer saved in {out} does not reload to the same tokenizer")


def _write(gguf: Path, dtype: torch.dtype, out: Path) -> None:
    from transformers import AutoTokenizer

    from dflash2.target import TargetModel

    model = TargetModel.from_pretrained(gguf, dtype=dtype).model
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are plain tensors in `dtype` after loading; only the quantizer tag left by the
    # GGUF loader stops `save_pretrained`.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    state = model.state_dict()
    verify(out, dtype, state, tokenizer)
    (out / MARKER).write_text(json.dumps({**_stamp(gguf), "dtype": str(dtype), "tensors": len(state)}, indent=1))


def dequantized_copy(gguf: str | os.PathLike, dtype: torch.dtype) -> Path:
    """The directory of `gguf`'s dequantized copy in `dtype`, written first if it is missing or
    stale (see the module docstring). Loads with `TargetModel.from_pretrained(dir)` and
    `AutoTokenizer.from_pretrained(dir)`."""
    gguf = Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file {gguf} does not exist")
    final = copy_dir(gguf, dtype)
    if is_current(gguf, dtype):
        return final
    with open(final.with_name(final.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # another process may be writing it: wait
        if is_current(gguf, dtype):
            return final
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=gguf.parent))
        try:
            _write(gguf, dtype, work)
            if final.exists():
                shutil.rmtree(final)               # a stale copy (the GGUF changed)
            os.replace(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final
