#!/usr/bin/env bash
# One device call: GPU tests (kernels at real shapes, whole loop triton vs torch) + kernel bench.
# Usage (repo root, on a CUDA machine): bash scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-gpu_out}}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/env.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$out/env.txt"
timeout 330 python3 -m pytest tests/kernels tests/test_gpu_loop.py -m "gpu or not gpu" -q -p no:cacheprovider \
    -o addopts="" 2>&1 | tee "$out/pytest_gpu.txt" | tail -25
timeout 180 python3 -m dflash2.kernels.bench --out "$out/bench.md" 2>&1 | tee "$out/bench_stdout.txt" | tail -40
