"""scripts/carry.py: split a file into checked parts, park them call by call, reassemble and check."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.script_modules import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "carry.py"


@pytest.fixture(scope="module")
def carry():
    return load_script("scripts/carry.py", "carry_script")


@pytest.fixture
def blob(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(12 * 1000 + 345))  # 13 parts of 1000 bytes: part010 sorts before part002 in a glob
    return path


def test_split_then_assemble_is_the_same_file(carry, blob, tmp_path):
    d = carry.split(blob, tmp_path / "carry", 1000)
    m = json.loads((d / "manifest.json").read_text())
    assert m["size"] == blob.stat().st_size and m["sha256"] == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert [p["size"] for p in m["parts"]] == [1000] * 12 + [345]
    assert all(p["sha256"] == hashlib.sha256((d / p["file"]).read_bytes()).hexdigest() for p in m["parts"])
    out = carry.assemble(d, tmp_path / "back" / "model.gguf")
    assert out.read_bytes() == blob.read_bytes()
    with pytest.raises(carry.CarryError, match="exists"):
        carry.split(blob, tmp_path / "carry", 1000)


def test_parts_parked_call_by_call_then_assembled(carry, blob, tmp_path):
    d = carry.split(blob, tmp_path / "carry", 5000)  # 3 parts
    files = sorted(p["file"] for p in carry.read_manifest(d)["parts"])
    for i, f in enumerate(files):  # each "call" carries the manifest and one part
        call = tmp_path / f"call{i}" / "model.gguf"
        call.mkdir(parents=True)
        for name in ("manifest.json", f):
            (call / name).write_bytes((d / name).read_bytes())
        parked, missing = carry.park(call, tmp_path / "tmpcarry")
        assert [p["file"] for p in missing] == files[i + 1:]
    assert carry.assemble(parked, tmp_path / "model.gguf").read_bytes() == blob.read_bytes()


def test_missing_corrupt_and_swapped_parts_are_named_and_nothing_is_written(carry, blob, tmp_path):
    d = carry.split(blob, tmp_path / "carry", 1000)
    out = tmp_path / "out.gguf"
    (d / "model.gguf.part003").unlink()
    with pytest.raises(carry.CarryError, match=r"missing 1 of 13 parts: model.gguf.part003"):
        carry.assemble(d, out)
    d = carry.split(blob, tmp_path / "carry2", 1000)
    data = bytearray((d / "model.gguf.part007").read_bytes())
    data[10] ^= 1
    (d / "model.gguf.part007").write_bytes(bytes(data))
    with pytest.raises(carry.CarryError, match=r"model.gguf.part007 has the wrong SHA-256"):
        carry.assemble(d, out)
    d = carry.split(blob, tmp_path / "carry3", 1000)
    a, b = (d / "model.gguf.part002").read_bytes(), (d / "model.gguf.part010").read_bytes()
    (d / "model.gguf.part002").write_bytes(b)  # the two parts in the wrong order
    (d / "model.gguf.part010").write_bytes(a)
    with pytest.raises(carry.CarryError, match=r"part002 has the wrong SHA-256.*part010 has the wrong SHA-256"):
        carry.assemble(d, out)
    (d / "model.gguf.part012").write_bytes(b"short")
    with pytest.raises(carry.CarryError, match=r"part012 has 5 bytes, the manifest says 345"):
        carry.assemble(d, out)
    assert not out.exists() and not list(tmp_path.glob(".out.gguf.*"))
    with pytest.raises(carry.CarryError, match="wrong SHA-256"):  # park refuses a wrong part too
        carry.park(d, tmp_path / "park")


def test_cli_errors_are_one_line(blob, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)

    r = run("split", str(blob), "--part-size", "4KiB", "--out", str(tmp_path / "c"))
    assert r.returncode == 0 and "4 parts" in r.stdout
    (tmp_path / "c" / "model.gguf" / "model.gguf.part001").unlink()
    r = run("check", str(tmp_path / "c" / "model.gguf"))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"carry.py check: {tmp_path / 'c' / 'model.gguf'}: missing 1 of 4 parts: model.gguf.part001"]
    r = run("split", str(blob), "--part-size", "0MiB", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "positive number" in r.stderr and not (tmp_path / "d").exists()


def test_wheels_commands(carry, tmp_path):
    cmd = carry.download_command(["gguf==0.10.0"], tmp_path, [31])
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--no-deps" in cmd and cmd[-1] == "gguf==0.10.0"
    assert {"manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_31_x86_64"} <= set(cmd)
    with pytest.raises(carry.CarryError, match="no .whl files"):
        carry.install_command(tmp_path, Path("/tmp/site"))
    for name in ("hydra_core-1.3.2-py3-none-any.whl", "omegaconf-2.3.0-py3-none-any.whl",
                 "Hydra.Core-1.3.1-py3-none-any.whl"):
        (tmp_path / name).touch()
    with pytest.raises(carry.CarryError, match="two versions of one project.*hydra-core"):
        carry.install_command(tmp_path, Path("/tmp/site"))
    (tmp_path / "Hydra.Core-1.3.1-py3-none-any.whl").unlink()
    cmd = carry.install_command(tmp_path, Path("/tmp/site"))
    assert cmd[cmd.index("--target") + 1] == "/tmp/site" and "--no-index" in cmd and len(cmd) == 14


def _checkout(root: Path) -> Path:
    """A git checkout with 1000 tracked bytes, 500 untracked, 700 ignored, and a 300-byte shared/
    folder that .gitignore also ignores (the device tool carries shared/ all the same)."""
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("ignored.bin\n/shared/\n")
    (root / "tracked.bin").write_bytes(b"t" * 1000)
    subprocess.run(["git", "-C", str(root), "add", ".gitignore", "tracked.bin"], check=True)
    (root / "untracked.bin").write_bytes(b"u" * 500)
    (root / "ignored.bin").write_bytes(b"i" * 700)
    (root / "shared" / "data").mkdir(parents=True)
    (root / "shared" / "data" / "x.jsonl").write_bytes(b"s" * 300)
    return root


def test_travelling_bytes_counts_what_a_device_call_carries(carry, tmp_path):
    repo = _checkout(tmp_path / "repo")
    gitignore = len((repo / ".gitignore").read_bytes())
    assert carry.travelling_bytes(repo) == 1000 + 500 + 300 + gitignore   # not ignored.bin
    (repo / "shared" / "data" / "x.jsonl").unlink()
    assert carry.travelling_bytes(repo) == 1000 + 500 + gitignore
    with pytest.raises(carry.CarryError, match="not a git checkout"):
        carry.travelling_bytes(tmp_path)


def test_auto_part_size_fills_the_call_beside_the_checkout(carry, tmp_path):
    repo = _checkout(tmp_path / "repo")
    (repo / "untracked.bin").write_bytes(b"u" * (3 * carry.MIB + 5))            # the checkout is now ~3 MiB
    mib = carry.MIB
    assert carry.auto_part_size(repo, limit=10 * mib, margin=mib) == 5 * mib     # 10 - 1 - 3.x, whole MiB down
    with pytest.raises(carry.CarryError, match="leaves 0 bytes of the 4 MiB"):
        carry.auto_part_size(repo, limit=4 * mib, margin=mib)


def test_split_auto_from_the_checkout_root(tmp_path, blob):
    repo = _checkout(tmp_path / "repo")
    r = subprocess.run([sys.executable, str(SCRIPT), "split", str(blob), "--out", str(tmp_path / "c")], cwd=repo,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "c" / "model.gguf" / "manifest.json").read_text())
    assert m["part_size"] == 62 << 20 and len(m["parts"]) == 1 and "1 parts" in r.stdout
