"""Every Triton kernel compiles for the H200 (sm_90, down to a cubin) at the engine's shapes, and
its shared memory fits, on a machine without a GPU (`tests/kernels/sm90_compile.py` says how and
what it does not show). It runs in a subprocess without TRITON_INTERPRET, since the interpreter
the CPU suite runs under replaces the JIT functions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("sm90_compile.py")


def _nvidia_backend() -> bool:
    try:
        from triton import backends
    except ImportError:
        return False
    return "nvidia" in getattr(backends, "backends", {})


pytestmark = pytest.mark.skipif(not _nvidia_backend(), reason="this triton has no NVIDIA backend to compile with")


def _run(*args: str) -> tuple[int, list[dict], str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, rows, proc.stderr[-2000:]


def _launched_kernels() -> set[str]:
    """Names of the JIT functions that `dflash2/kernels` launches (`name[grid](...)`)."""
    names = set()
    for path in (ROOT / "dflash2" / "kernels").rglob("*.py"):
        names |= set(re.findall(r"\b(_\w+(?:_kernel|_fwd))\[", path.read_text()))
    return names


def test_every_kernel_compiles_for_the_h200_and_fits_its_shared_memory():
    code, rows, err = _run()
    failed = [r for r in rows if not r["ok"]]
    assert code == 0 and rows and not failed, f"failed launches: {failed}\n{err}"
    compiled = {r["kernel"] for r in rows}
    assert _launched_kernels() <= compiled, f"kernels without a compile case: {_launched_kernels() - compiled}"
    # the settings the GPU runs, not the interpreter's: 16-bit linears without the fp32 widening
    linear = [r for r in rows if r["kernel"] == "_small_m_linear_kernel" and "float32" not in r["case"]]
    assert linear and all(r["constexprs"]["WIDEN"] is False and r["constexprs"]["IEEE"] is False for r in linear)
    assert any(r["constexprs"].get("ROW_TILES") == 4 for r in linear)  # the row groups of a 128-row verify
    # with the runtime's alignment specializations the weight tiles load by 16-byte async copies,
    # and a fused group (members read in place) compiles to the same loads and shared memory as
    # its concatenation in one matrix
    assert all(r["async_copies"] > 0 for r in linear)
    by_case = {r["case"]: r for r in rows}
    pairs = [("8b 4096+1024+1024x4096", "8b 6144x4096"), ("8b 12288+12288x4096", "8b 24576x4096"),
             ("135m 576+192+192x576", "135m 960x576")]
    for fused, whole in pairs:
        fp32 = ("float32 M=16",) if fused.startswith("135m") else ()
        for suffix in ("bfloat16 M=1", "bfloat16 M=16", "bfloat16 M=128", *fp32):
            a, b = by_case[f"linear {fused} {suffix}"], by_case[f"linear {whole} {suffix}"]
            assert (a["async_copies"], a["shared_bytes"]) == (b["async_copies"], b["shared_bytes"]), (fused, suffix)


def test_the_check_reports_a_kernel_that_fails_and_one_past_the_shared_memory():
    code, rows, _ = _run("--selftest")
    assert code == 1 and len(rows) == 2 and not any(r["ok"] for r in rows)
    assert "CompilationError" in rows[0]["error"]
    assert rows[1]["shared_bytes"] > 232448 and "shared memory" in rows[1]["error"]
