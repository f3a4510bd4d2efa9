#!/usr/bin/env bash
# The issue-10 GPU experiment with the real SmolLM2-135M-Instruct target: DFlash2 (conv +
# selector) vs conv only (selector loss weight 0: the selector stays at its identity init, i.e.
# per-slot argmax) vs DFlash v1 (neither), same regenerated data, seed and optimizer steps; then
# the evaluation runner on each at T=0 and T=1, plus the N sweep of the DFlash2 arm.
#
#   PHASE=train OUT=DIR bash scripts/gpu_ablation.sh   # regenerate GSM8K-train answers, train 3 arms (parallel)
#   PHASE=eval  OUT=DIR bash scripts/gpu_ablation.sh   # 3 arms x {T=0, T=1} + the N sweep (parallel)
#   DRY_RUN=1 PHASE=train|eval OUT=DIR bash ...       # the same pipeline on this CPU, tiny budgets
#   Knobs: LIMIT (items per dataset, 500: GSM8K 500, all of HumanEval and MT-Bench), EVAL_BATCH (128),
#   STEPS, NPROMPTS, TRAIN_GPUS, EVAL_GPUS, TRAIN_BUDGET_S, EVAL_BUDGET_S.
#
# Work lives in ./.ablation (ignored; a warm device machine keeps it between back-to-back calls);
# what the docs need goes to $OUT as ablation_train.tgz / ablation_eval.tgz (at most 8 files come
# back). Placement: training and regeneration on GPU $TRAIN_GPU; the eval jobs alternate over the
# GPUs listed in $EVAL_GPUS. Several processes share a GPU: each eval run interleaves its arms per
# prompt, so its speedups are paired within one process, but absolute times include the sharing.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}"
mkdir -p "$OUT"
DRY=${DRY_RUN:-0}
if [ "$DRY" = 1 ]; then
  export WANDB_MODE=disabled HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
  GGUF=${GGUF:-$(python3 -c "from dflash2.assets import smollm2_gguf; d, n = smollm2_gguf(); print(f'{d}/{n}')")}
  HW="hardware=cpu"
  STEPS=${STEPS:-4}; NPROMPTS=${NPROMPTS:-8}; LIMIT=${LIMIT:-2}; NEW=${NEW:-16}; SWEEP_LIMIT=${SWEEP_LIMIT:-2}
  RBS=4; TBS=2; ANCH=8; SEQ=256; CKPT=2; HELD=2; EVP=1; EVNEW=4; SWEEP="[1,3]"
else
  GGUF_GIVEN=${GGUF:-}
  source scripts/device_env.sh  # (it sets GGUF to its own default path)
  GGUF=${GGUF_GIVEN:-$PWD/.gguf/SmolLM2-135M-Instruct.Q4_1.gguf}
  HW="hardware=gpu"
  STEPS=${STEPS:-1500}; NPROMPTS=${NPROMPTS:-3000}; LIMIT=${LIMIT:-500}; NEW=${NEW:-256}; SWEEP_LIMIT=${SWEEP_LIMIT:-64}
  RBS=512; TBS=8; ANCH=128; SEQ=512; CKPT=250; HELD=16; EVP=8; EVNEW=96; SWEEP="[1,2,3,5,7,10,15]"
fi
read -r -a TGPUS <<< "${TRAIN_GPUS:-${TRAIN_GPU:-0}}"  # GPU of each arm in turn (dflash2, conv, v1), cycled
read -r -a GPUS <<< "${EVAL_GPUS:-0}"
W=${ABL_DIR:-$PWD/.ablation}  # outside the checkout on the device (scripts/gpu_session.sh)
mkdir -p "$W"
RT="target.path=$GGUF $HW"  # regenerate.py has no logger group
T="$RT logger=disabled"

if [ "${PHASE}" = train ]; then
  t0=$(date +%s)
  [ -s "$W/regen/regenerated.jsonl" ] && R=true || R=false
  CUDA_VISIBLE_DEVICES=${TGPUS[0]} python3 train/regenerate.py target=smollm2-135m $RT data=gsm8k-train \
      data.limit=$NPROMPTS data.max_new_tokens=$NEW data.regen_batch_size=$RBS output_dir=$W/regen resume=$R \
      > $W/regen.log 2>&1
  echo "regenerate rc=$? $(( $(date +%s) - t0 )) s, $(wc -l < $W/regen/regenerated.jsonl) rows"
  C="experiment=smollm2_gpu $T data.regenerated=$W/regen/regenerated.jsonl train.max_steps=$STEPS train.seed=0
     train.batch_size=$TBS train.num_anchors=$ANCH data.max_seq_len=$SEQ data.limit=$NPROMPTS data.heldout=$HELD
     draft.selector_rank=64 train.eval_every=0 train.eval_prompts=$EVP train.eval_max_new_tokens=$EVNEW
     train.checkpoint_every=$CKPT train.progress=false train.log_every=25"
  # Idempotent: a finished arm is skipped, an interrupted one resumes from its last checkpoint,
  # so a call that runs out of time is continued by the next (PHASE=train again).
  arm() {  # name, GPU, extra overrides...
    local a=$1 gpu=$2; shift 2
    [ -d "$W/$a/final" ] && return 0
    local r=false; [ -d "$W/$a" ] && r=true
    CUDA_VISIBLE_DEVICES=$gpu timeout ${TRAIN_BUDGET_S:-480} python3 train/distill.py $C output_dir=$W/$a \
        resume=$r "$@" >> $W/train_$a.log 2>&1
    echo "arm $a rc=$?" >> $W/train_$a.log
  }
  n=${#TGPUS[@]}
  arm dflash2 ${TGPUS[0]} &
  arm conv ${TGPUS[$((1 % n))]} train.selector_alpha=0 &
  arm v1 ${TGPUS[$((2 % n))]} draft.architecture=v1 &
  wait
  echo "training done $(( $(date +%s) - t0 )) s"
  for a in dflash2 conv v1; do
    echo "== $a"; tail -n 2 $W/train_$a.log
    cp $W/$a/metrics.jsonl $W/metrics_$a.jsonl 2>/dev/null
    (cd $W && sha256sum $a/final/*.safetensors 2>/dev/null)
  done | tee $W/train_summary.txt
  tar czf $OUT/ablation_train.tgz -C $W train_summary.txt regen.log $(cd $W && ls train_*.log metrics_*.jsonl 2>/dev/null)
fi

if [ "${PHASE}" = eval ]; then
  t0=$(date +%s)
  # The eager loop is launch-bound: a step costs about the same at batch 32 and 128, so a big batch
  # is what fits the full datasets in one call (2026-11-30: batch 32, limit 100 ran ~2 samples x arms/s per run).
  E="experiment=smollm2_gpu $T max_new_tokens=$NEW batch_size=${EVAL_BATCH:-128} data.limit=$LIMIT stats.n_resamples=2000"
  i=0
  job() {  # output dir name, overrides...: one eval/run.py process on the next GPU of $EVAL_GPUS
    local name=$1; shift
    local gpu=${GPUS[$((i % ${#GPUS[@]}))]}
    i=$((i + 1))
    # Each job has a time limit so the archive below is always written; a job cut short keeps
    # its finished records (scripts/ablation_report.py summarizes records without a summary).
    # A run dir left by an earlier call (cut short by its limit) is continued, not refused.
    local r=false; [ -d "$W/$name" ] && r=true
    CUDA_VISIBLE_DEVICES=$gpu timeout --kill-after=10 ${EVAL_BUDGET_S:-540} python3 eval/run.py $E \
        output_dir=$W/$name resume=$r "$@" >> $W/$name.log 2>&1 &
  }
  for a in dflash2 conv v1; do
    for temp in 0 1; do
      sel=false; [ $a = dflash2 ] && sel=true
      job eval_${a}_T$temp draft_path=$W/$a/final temperature=$temp "arms.num_speculative_tokens=[7]" \
          arms.selector_off=$sel arms.oracle=false
    done
  done
  # The sweep runs its prompts in several batches (SWEEP_BATCH): a batch is timed as one, so its
  # speedup CI resamples batches, and one batch would give none.
  job sweep_dflash2 draft_path=$W/dflash2/final temperature=0 "data.datasets=[gsm8k]" data.limit=$SWEEP_LIMIT \
      batch_size=${SWEEP_BATCH:-16} \
      "arms.num_speculative_tokens=$SWEEP" arms.selector_off=false arms.oracle=false
  wait
  echo "eval done $(( $(date +%s) - t0 )) s"
  # Everything the docs need in one archive: summaries, records, reports, plots, logs.
  runs=$(cd $W && ls -d eval_* sweep_* 2>/dev/null | grep -v '\.log$')
  files=$(cd $W && for r in $runs; do ls -d $r/summary.json $r/records.jsonl $r/report.md $r/plots $r/.hydra 2>/dev/null; done)
  tar czf $OUT/ablation_eval.tgz -C $W $files $(cd $W && ls eval_*.log sweep_*.log 2>/dev/null)
  for r in $runs; do echo "== $r"; tail -n 3 $W/$r.log; done
fi
ls -la $OUT
