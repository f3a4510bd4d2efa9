# sourced by every call: wheels into /tmp/site once per machine, shared/data kept under /tmp/keep
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.ok ]; then
  pv=$(python3 -c "import pyarrow;print(pyarrow.__version__.split('.')[0])")
  echo "pyarrow major $pv"; python3 -m pip show fsspec pyarrow huggingface_hub 2>/dev/null | grep -E "^(Name|Version)"
  if [ "$pv" -lt 24 ]; then rm -f .whl/datasets-*.whl; cp .whl_alt/datasets-*.whl .whl/; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.ok
fi
export PYTHONPATH=/tmp/site:$PWD
if [ -d shared/data ]; then mkdir -p /tmp/keep && cp -r shared /tmp/keep/ ; elif [ -d /tmp/keep/shared ]; then cp -r /tmp/keep/shared . ; fi
# the target: Q (its preset) and G (its GGUF's file name in the dflash2 cache)
Q=${Q:-qwen2.5-coder-0.5b}
G=$(python3 -c "import sys; print({'qwen2.5-coder-0.5b': 'qwen2.5-coder-0.5b-instruct-q4.gguf', 'qwen2.5-coder-1.5b': 'qwen2.5-coder-1.5b-instruct-q4_k_m.gguf'}[sys.argv[1]])" $Q)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
