"""The evaluation and training data that ship inside the package: GSM8K test (1319 rows) and
train (7473 rows), MIT, and MT-Bench's 80 questions, Apache-2.0.

Layout (this folder; `README.md` beside this file says where each file comes from):

    MANIFEST.json               name -> file, SHA-256 of the file, SHA-256 of its JSONL, rows, license
    gsm8k/test.jsonl.gz         {"question", "answer"}; the final answer follows `#### `
    gsm8k/train.jsonl.gz
    gsm8k/LICENSE               MIT (openai/grade-school-math)
    mt_bench/question.jsonl.gz  {"question_id", "category", "turns", "reference"?}
    mt_bench/LICENSE            Apache-2.0 (lm-sys/FastChat)

Contract: `read_rows(name)` returns the rows of the upstream JSONL, in file order, only after the
shipped file's SHA-256 equals the manifest's; a missing or different file raises `DataFileError`
(one message: which file, what was found, how to restore it). Files are gzip (zlib ships with
every Python, unlike lzma). Rows are filled with `None` for keys other rows carry, as the
`datasets` JSON loader fills them, so an item built from these rows equals one built from the
same file through `datasets.load_dataset("json", ...)`.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
MANIFEST = "MANIFEST.json"


class DataFileError(FileNotFoundError):
    """A shipped data file is missing or its SHA-256 is not the manifest's (the message names the
    file and the fix)."""


@functools.lru_cache(maxsize=4)
def _manifest_at(directory: Path) -> dict[str, dict]:
    with open(directory / MANIFEST) as f:
        return json.load(f)


def manifest(directory: Path | None = None) -> dict[str, dict]:
    """The manifest: data set name (`gsm8k/test`, `gsm8k/train`, `mt_bench/question`) -> entry
    with `file`, `sha256` (of the shipped file), `jsonl_sha256` (of the decompressed upstream
    JSONL), `rows`, `license` (a path beside the file), `license_name` and `source`."""
    return _manifest_at((directory or DATA_DIR).resolve())


def names(directory: Path | None = None) -> list[str]:
    """The shipped data sets' names, sorted."""
    return sorted(manifest(directory))


def _entry(name: str, directory: Path | None) -> dict:
    table = manifest(directory)
    if name not in table:
        raise KeyError(f"no shipped data set {name!r}; shipped: {', '.join(sorted(table))}")
    return table[name]


def data_file(name: str, directory: Path | None = None) -> Path:
    """Path of the shipped file of data set `name`, checked against the manifest's SHA-256.

    Args:
        name: a manifest key, e.g. `gsm8k/test`.
        directory: the data folder (default: this package's; tests pass a copy).
    Raises:
        KeyError: `name` is not in the manifest.
        DataFileError: the file is missing or its digest differs from the manifest's.
    """
    entry = _entry(name, directory)
    path = (directory or DATA_DIR) / entry["file"]
    fix = ("reinstall dflash2 (pip install --force-reinstall dflash2), or in a checkout restore it "
           "with `git checkout -- dflash2/data`")
    if not path.is_file():
        raise DataFileError(f"shipped data file {path} is missing; {fix}")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != entry["sha256"]:
        raise DataFileError(f"shipped data file {path} has SHA-256 {got}, the manifest says {entry['sha256']} "
                            f"(the file was changed or damaged); {fix}")
    return path


def read_rows(name: str, directory: Path | None = None) -> list[dict]:
    """The rows of data set `name` (see the module docstring for the contract), a fresh list of
    fresh dicts on every call.

    Raises:
        KeyError, DataFileError: as `data_file`.
    """
    path = data_file(name, directory)
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()
            if line.strip()]
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return [{k: row.get(k) for k in keys} for row in rows]


def license_file(name: str, directory: Path | None = None) -> Path:
    """Path of the license that covers data set `name` (it ships beside the data file)."""
    return (directory or DATA_DIR) / _entry(name, directory)["license"]
