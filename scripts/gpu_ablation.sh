#!/usr/bin/env bash
# The issue-10 GPU experiment on one H200, with the real SmolLM2-135M-Instruct target:
# DFlash2 (conv + selector) vs conv only (selector loss weight 0: the selector stays at its
# identity init, i.e. per-slot argmax) vs DFlash v1 (neither), same regenerated data, seed and
# optimizer steps; then the evaluation runner on each at T=0 and T=1, plus the N sweep of the
# DFlash2 arm.
#
#   PHASE=train bash scripts/gpu_ablation.sh   # regenerate GSM8K-train answers, train 3 arms (parallel)
#   PHASE=eval  bash scripts/gpu_ablation.sh   # evaluate the 3 arms x {T=0, T=1} + the N sweep (parallel)
#
# Work lives in ./.ablation (ignored; the warm device machine keeps it between back-to-back
# calls); results worth keeping are copied to $OUT. The GGUF arrives in two parts (device_env.sh).
# Several processes share the GPU: each eval run interleaves its arms per prompt, so its
# speedups are paired within one process, but absolute times include the sharing.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
: "${OUT:?set OUT}"
W=$PWD/.ablation
GGUF=$PWD/.gguf/SmolLM2-135M-Instruct.Q4_1.gguf
STEPS=${STEPS:-1500}
NPROMPTS=${NPROMPTS:-3000}
LIMIT=${LIMIT:-100}
mkdir -p "$W"
T="target.path=$GGUF hardware=gpu logger=disabled"

if [ "${PHASE}" = train ]; then
  t0=$(date +%s)
  [ -s "$W/regen/regenerated.jsonl" ] && R=true || R=false
  python3 train/regenerate.py target=smollm2-135m $T data=gsm8k-train data.limit=$NPROMPTS data.max_new_tokens=256 \
      data.regen_batch_size=512 output_dir=$W/regen resume=$R > $OUT/regen.log 2>&1
  echo "regenerate rc=$? $(( $(date +%s) - t0 )) s, $(wc -l < $W/regen/regenerated.jsonl) rows"
  C="experiment=smollm2_gpu $T data.regenerated=$W/regen/regenerated.jsonl train.max_steps=$STEPS train.seed=0
     train.batch_size=8 train.num_anchors=128 data.max_seq_len=512 draft.selector_rank=64 train.eval_every=0
     train.checkpoint_every=250 train.progress=false train.log_every=50"
  # Idempotent: a finished arm is skipped, an interrupted one resumes from its last checkpoint,
  # so a call that runs out of time is continued by the next (PHASE=train again).
  arm() {  # name, extra overrides...
    local a=$1; shift
    [ -d "$W/$a/final" ] && return 0
    local r=false; [ -d "$W/$a" ] && r=true
    timeout ${TRAIN_BUDGET_S:-480} python3 train/distill.py $C output_dir=$W/$a resume=$r "$@" >> $OUT/train_$a.log 2>&1
  }
  arm dflash2 &
  arm conv train.selector_alpha=0 &
  arm v1 draft.architecture=v1 &
  wait
  echo "training done $(( $(date +%s) - t0 )) s"
  for a in dflash2 conv v1; do
    tail -n 3 $OUT/train_$a.log
    cp $W/$a/metrics.jsonl $OUT/metrics_$a.jsonl 2>/dev/null
    sha256sum $W/$a/final/*.safetensors 2>/dev/null | sed "s#$W/##"
  done | tee $OUT/train_summary.txt
fi

if [ "${PHASE}" = eval ]; then
  t0=$(date +%s)
  E="experiment=smollm2_gpu $T max_new_tokens=256 batch_size=32 data.limit=$LIMIT stats.n_resamples=2000"
  for a in dflash2 conv v1; do
    for temp in 0 1; do
      sel=false; [ $a = dflash2 ] && sel=true
      python3 eval/run.py $E draft_path=$W/$a/final temperature=$temp "arms.num_speculative_tokens=[7]" \
          arms.selector_off=$sel arms.oracle=false output_dir=$W/eval_${a}_T$temp > $OUT/eval_${a}_T$temp.log 2>&1 &
    done
  done
  python3 eval/run.py $E draft_path=$W/dflash2/final temperature=0 "data.datasets=[gsm8k]" data.limit=64 \
      "arms.num_speculative_tokens=[1,2,3,5,7,10,15]" arms.selector_off=false arms.oracle=false \
      output_dir=$W/sweep_dflash2 > $OUT/eval_sweep.log 2>&1 &
  wait
  echo "eval done $(( $(date +%s) - t0 )) s"
  # Everything the docs need, in few files (at most 8 come back): summaries, records, plots.
  tar czf $OUT/ablation_eval.tgz -C $W $(cd $W && ls -d eval_* sweep_* | sed 's#$#/summary.json#') \
      $(cd $W && ls -d eval_* sweep_* | sed 's#$#/records.jsonl#') $(cd $W && ls -d eval_* sweep_* | sed 's#$#/report.md#') \
      $(cd $W && ls -d eval_* sweep_* | sed 's#$#/plots#') 2>/dev/null
  ls -la $OUT
  for f in $OUT/eval_*.log; do echo "== $f"; tail -n 4 $f; done
fi
