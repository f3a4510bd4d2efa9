"""Benchmarks of the engine and its kernels (run from the repository root):

    python -m benchmarks.engine ...    # per-step wall clock of our arms against HF peers and floors
    python -m benchmarks.kernels ...   # every kernel against its reference

They are tools, not part of the `dflash2` package: they import the package, never the reverse.
"""
