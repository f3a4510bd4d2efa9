"""JSON Lines IO with one rule for torn lines, used by every file the product appends to
(evaluation records, training metrics, regenerated data).

Contract:
- `append_jsonl(path, rows)` writes each row as one line `json.dumps(row) + "\\n"`, flushed and
  fsynced, so a kill can tear at most the last line. Non-finite floats are written as JSON
  `null` (`to_jsonable`), never as `NaN` or `"nan"`.
- A *torn* line is a line that does not parse as a JSON object. Only the last line of a file can
  be torn by a kill; a bad line anywhere else is corruption, not a kill.
- `read_jsonl(path)` (reading only): a torn last line is skipped with one warning; a bad line
  before the last raises `JsonlError` naming the file and line number.
- `repair_jsonl(path)` (before appending on resume): a torn last line is dropped with one
  warning and the file is rewritten atomically (temporary file + `os.replace`); returns the
  parsed rows. A bad line before the last raises `JsonlError`.
- `rewrite_jsonl(path, rows)` replaces the whole file atomically.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path


class JsonlError(ValueError):
    """A JSONL file is corrupt somewhere other than its last line (not a torn write)."""


class TornLineWarning(UserWarning):
    """The last line of a JSONL file was torn (a write killed midway) and was skipped or dropped."""


def to_jsonable(value):
    """`value` with non-finite floats (NaN, +-inf) replaced by None, recursively through dicts,
    lists and tuples; other values unchanged."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def dumps_line(row: dict) -> str:
    """One JSONL line (with its newline) for `row`; non-finite floats become null."""
    return json.dumps(to_jsonable(row), allow_nan=False) + "\n"


def append_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Append `rows` to `path` (created if missing), one line each, then flush and fsync."""
    text = "".join(dumps_line(r) for r in rows)
    if not text:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _parse(path: Path) -> tuple[list[dict], int | None]:
    """Rows of `path` and the 1-based number of a torn last line (None when the file is whole)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    # A whole file ends with "\n", so its split ends with ""; a torn one ends mid-line.
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    rows: list[dict] = []
    for k, (lineno, line) in enumerate(numbered):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if k == len(numbered) - 1:
                return rows, lineno
            raise JsonlError(f"{path}:{lineno}: not a JSON object line ({e}); the file is corrupt "
                             f"before its last line, which a killed write cannot cause") from None
        rows.append(row)
    return rows, None


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of `path` for reading only: a torn last line is skipped with a `TornLineWarning`."""
    path = Path(path)
    rows, torn = _parse(path)
    if torn is not None:
        warnings.warn(f"{path}:{torn}: skipped a torn last line (a write that was killed midway)",
                      TornLineWarning, stacklevel=2)
    return rows


def rewrite_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Replace `path` by `rows` atomically: a kill leaves either the old or the new file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(dumps_line(r) for r in rows))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def repair_jsonl(path: str | Path) -> list[dict]:
    """Rows of `path` before appending to it on resume. A torn last line is dropped with a
    `TornLineWarning` and the file rewritten atomically; a whole last line without its newline
    gets one. A missing file gives []."""
    path = Path(path)
    if not path.is_file():
        return []
    rows, torn = _parse(path)
    if torn is not None:
        warnings.warn(f"{path}:{torn}: dropped a torn last line (a write that was killed midway); "
                      f"the file is rewritten with the {len(rows)} whole rows", TornLineWarning,
                      stacklevel=2)
        rewrite_jsonl(path, rows)
    elif path.stat().st_size and not path.read_bytes().endswith(b"\n"):
        rewrite_jsonl(path, rows)
    return rows
