"""Choose a kernel implementation once, visibly (STYLE.md item 3).

Callers resolve ``impl`` at construction time with :func:`resolve_impl` and pass the resolved
string (``"torch"`` or ``"triton"``) to every op; ops never read the environment themselves.
"""

from __future__ import annotations

import importlib.util
import os

import torch

IMPLS = ("auto", "torch", "triton")


def triton_available() -> bool:
    """True when the ``triton`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET=1``: Triton kernels then run (slowly) on CPU tensors.

    The variable only takes effect if it is set before the kernel modules are imported, because
    ``@triton.jit`` picks the interpreter at decoration time.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def resolve_impl(impl: str, device: torch.device | str) -> str:
    """Resolve ``impl`` (``"auto" | "torch" | "triton"``) for tensors on ``device``.

    Args:
        impl: the requested implementation.
        device: the device the op's tensors will live on.

    Returns:
        ``"torch"`` or ``"triton"``. ``auto`` picks Triton on CUDA when it imports, else the
        torch reference. An explicit ``"triton"`` that cannot run raises with the fix.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    device = torch.device(device)
    if impl == "torch":
        return "torch"
    has_triton = triton_available()
    if impl == "auto":
        return "triton" if (device.type == "cuda" and has_triton) else "torch"
    # impl == "triton": say exactly what is missing and how to fix it.
    if not has_triton:
        raise RuntimeError(
            "impl='triton' was requested but the 'triton' package is not importable; "
            "install it (`pip install triton`) or use impl='auto' / impl='torch'."
        )
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu" and triton_interpreter_enabled():
        return "triton"
    raise RuntimeError(
        f"impl='triton' cannot run on device {device}: Triton kernels need a CUDA device "
        "(or CPU tensors with TRITON_INTERPRET=1 set before dflash2.kernels is imported, for "
        "tests). Move the tensors to CUDA or use impl='auto' / impl='torch'."
    )


def triton_binaries(per_kernel: bool = False) -> int | dict[str, int]:
    """How many Triton binaries dflash2's kernels hold, over every device (0 without Triton or
    under the interpreter, which compiles nothing); with `per_kernel`, {"module.kernel": count}.
    A rise between two calls means the second one compiled; `python -m benchmarks.prompt_lengths`
    and the GPU tests read it."""
    import sys

    counts: dict[str, int] = {}
    if triton_available() and not triton_interpreter_enabled():
        from triton.runtime.jit import JITFunction

        for name, module in list(sys.modules.items()):
            if not name.startswith("dflash2.kernels") or module is None:
                continue
            for attr, value in vars(module).items():
                if isinstance(value, JITFunction):
                    # device_caches: device -> (kernel cache, ...) in Triton 3.x
                    counts[f"{name}.{attr}"] = sum(len(entry[0]) for entry in value.device_caches.values())
    return counts if per_kernel else sum(counts.values())
