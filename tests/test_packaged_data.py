"""The data sets shipped in `dflash2/data`: loaded from the package, counts, licenses, the
manifest's digests, a tampered copy refused, and the package-data declaration that installs them."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest

from dflash2 import data
from dflash2.data import DataFileError, data_file, license_file, manifest, read_rows
from dflash2.evaluation.running import datasets as ds

REPO = Path(__file__).resolve().parent.parent
COUNTS = {"gsm8k/test": 1319, "gsm8k/train": 7473, "mt_bench/question": 80}
LICENSES = {"gsm8k/test": "MIT License", "gsm8k/train": "MIT License", "mt_bench/question": "Apache License"}


def test_the_data_comes_from_inside_the_package():
    assert data.DATA_DIR == (REPO / "dflash2" / "data").resolve()
    assert set(manifest()) == set(COUNTS)
    for name in COUNTS:
        assert data_file(name).is_relative_to(data.DATA_DIR)


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_counts_digests_and_license(name):
    entry = manifest()[name]
    rows = read_rows(name)
    assert len(rows) == COUNTS[name] == entry["rows"]
    # The shipped file decompresses to the upstream JSONL byte for byte.
    raw = gzip.decompress(data_file(name).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == entry["jsonl_sha256"]
    lic = license_file(name)
    assert lic.is_file() and lic.parent == data_file(name).parent
    assert LICENSES[name] in lic.read_text()[:200] and entry["license_name"] in ("MIT", "Apache-2.0")


def test_rows_have_the_upstream_fields():
    g = read_rows("gsm8k/test")[0]
    assert set(g) == {"question", "answer"} and "####" in g["answer"]
    mt = read_rows("mt_bench/question")
    assert {r["question_id"] for r in mt} == set(range(81, 161))
    assert len({r["category"] for r in mt}) == 8 and all(len(r["turns"]) == 2 for r in mt)
    # Keys only some rows carry are filled with None on the others, as the `datasets` JSON loader does.
    assert all("reference" in r for r in mt) and any(r["reference"] is None for r in mt)
    read_rows("gsm8k/test")[0]["question"] = "changed"  # each call returns fresh rows
    assert read_rows("gsm8k/test")[0]["question"] != "changed"


def _copy(tmp_path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(data.DATA_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    for f in copy.rglob("*"):
        f.chmod(0o644 if f.is_file() else 0o755)
    return copy


def test_a_tampered_copy_is_refused(tmp_path):
    copy = _copy(tmp_path)
    assert len(read_rows("mt_bench/question", copy)) == 80  # the untouched copy loads
    path = copy / "mt_bench" / "question.jsonl.gz"
    raw = gzip.decompress(path.read_bytes()).replace(b"Hawaii", b"Hawai'i")
    path.write_bytes(gzip.compress(raw, mtime=0))  # still valid gzip JSONL, different content
    with pytest.raises(DataFileError, match=r"question\.jsonl\.gz has SHA-256 [0-9a-f]{64}, the manifest says"):
        read_rows("mt_bench/question", copy)
    (copy / "gsm8k" / "test.jsonl.gz").unlink()
    with pytest.raises(DataFileError, match=r"test\.jsonl\.gz is missing; reinstall dflash2"):
        read_rows("gsm8k/test", copy)
    with pytest.raises(KeyError, match="no shipped data set 'gsm8k/dev'"):
        read_rows("gsm8k/dev", copy)


def test_the_loaders_read_the_shipped_files():
    assert [it.turns[0] for it in ds.load_items("gsm8k", source="local", limit=3)] == [
        r["question"] for r in read_rows("gsm8k/test")[:3]]
    assert ds.load_gsm8k("train", source="auto")[0].reference == read_rows("gsm8k/train")[0]["answer"]
    mt = ds.load_items("mt_bench", source="hub")  # no hub copy of MT-Bench: always the shipped one
    assert [it.item_id for it in mt] == [str(r["question_id"]) for r in read_rows("mt_bench/question")]


def test_package_data_installs_every_shipped_file():
    """pyproject's package-data globs cover the manifest, the data files and their licenses."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dflash2.data"]
    shipped = {p.relative_to(data.DATA_DIR) for p in data.DATA_DIR.rglob("*")
               if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    entries = manifest().values()
    listed = {Path(e["file"]) for e in entries} | {Path(e["license"]) for e in entries} | {Path("MANIFEST.json")}
    assert listed <= shipped
    assert all(any(p.match(g) for g in globs) for p in shipped), shipped
