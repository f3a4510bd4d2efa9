#!/usr/bin/env bash
# Multi-GPU distillation figures on one 2-GPU machine (issue 8 item 5, issue 11), one call, < 8 minutes:
#   (a) 1 GPU vs 2 GPUs DDP at the same global batch, STEPS steps: mean relative |delta loss|,
#       samples/s at 1 and 2 GPUs, scaling efficiency
#   (b) FSDP2 on 2 GPUs (configs/accelerate/fsdp_2gpu.yaml), 5-layer Qwen3-8B-shaped draft: peak
#       memory per GPU against DDP; it resumes the 1-GPU checkpoint of step STEPS/2 and trains to STEPS
#   (c) checkpoints across process counts: the DDP checkpoint (step STEPS/2) and the FSDP one
#       (step 3*STEPS/4) resumed on 1 GPU; the 1-GPU one resumed under FSDP (b) and, time permitting,
#       under DDP; each RESUME_STEPS steps compared with the 1-GPU curve -> one PASS/FAIL line
# Usage (repo root, 2 GPUs):  OUT=/path bash scripts/gpu_multi_distill.sh
# PARTS="one ddp fsdp resume_one" (a subset of the part names below) re-runs only those parts.
# Writes $OUT/multi_gpu.md (the table, also printed last), $OUT/results/*.json, $OUT/logs/*.log,
# $OUT/status.txt. Checkpoints (~13 GB each) go to $SCRATCH (default: a temp dir, removed at the end).
#
# Setting (why): the Qwen3-8B-shaped random bf16 target with the 5-layer draft is the real shape
# that (b) needs, so (a) uses it too; samples of LENGTH=512 tokens with ANCHORS=64 anchors and a
# global batch of BATCH=8 keep 100 steps x 3 runs (plus compile, checkpoint IO and the resumes)
# inside the budget. Synthetic data and the Python API (scripts/gpu_multi_distill.py): no hydra,
# datasets or wandb. Each part has its own timeout within BUDGET seconds; a failed part is reported
# and the script goes on. Knobs: STEPS BATCH LENGTH ANCHORS RESUME_STEPS BUDGET SCRATCH.
# DRY_RUN=1: the same pipeline on CPU (gloo) with the tiny target/draft of the tests, to check the
# script itself on a machine without GPUs (figures meaningless there).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-multi_gpu_out}
mkdir -p "$OUT/logs" "$OUT/results"
OUT=$(cd "$OUT" && pwd)
RES=$OUT/results
LOGS=$OUT/logs
: > "$OUT/status.txt"
# NVLink multicast off (device README); NCCL as usual otherwise.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
BUDGET=${BUDGET:-460}
STEPS=${STEPS:-100}
BATCH=${BATCH:-8}
LENGTH=${LENGTH:-512}
ANCHORS=${ANCHORS:-64}
RESUME_STEPS=${RESUME_STEPS:-5}
WARMUP=5
SAVE_ONE=$((STEPS / 2))
SAVE_FSDP=$((STEPS * 3 / 4))
START=$SECONDS
SCRATCH=${SCRATCH:-$(mktemp -d "${TMPDIR:-/tmp}/multi_distill.XXXXXX")}
mkdir -p "$SCRATCH"
trap 'rm -rf "$SCRATCH"' EXIT
# Our own accelerate config dir (an accelerate default_config.yaml on the box must not leak in)
# and one inductor cache for all runs (FlexAttention compiles once, later launches reuse it).
export HF_HOME=$SCRATCH/hf TORCHINDUCTOR_CACHE_DIR=$SCRATCH/inductor
if command -v accelerate >/dev/null 2>&1; then LAUNCH=(accelerate launch); else LAUNCH=(python3 -m accelerate.commands.launch); fi
ONE_GPU=(--num_processes 1 --num_machines 1 --gpu_ids 0 --mixed_precision bf16 --dynamo_backend no)
DDP=(--config_file configs/accelerate/ddp_2gpu.yaml)
FSDP=(--config_file configs/accelerate/fsdp_2gpu.yaml)
W=scripts/gpu_multi_distill.py
COMMON=(--results "$RES" --batch "$BATCH" --length "$LENGTH" --anchors "$ANCHORS" --total "$STEPS")
if [ "${DRY_RUN:-0}" = 1 ]; then
  ONE_GPU=(--num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no)
  DDP+=(--mixed_precision no)
  FSDP+=(--mixed_precision no)
  COMMON+=(--tiny)
  export OMP_NUM_THREADS=1
fi

{
  nvidia-smi -L
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'gpus', torch.cuda.device_count())"
  df -h "$SCRATCH" | tail -1
  echo "launcher: ${LAUNCH[*]}; scratch: $SCRATCH"
} 2>&1 | tee "$OUT/env.txt"

PARTS=" ${PARTS:-one ddp fsdp resume_one resume_ddp} "  # a subset re-runs only those parts
part() {   # part NAME LIMIT_S CMD...: run under min(LIMIT_S, time left), log to $LOGS/NAME.log
  local name=$1 limit=$2
  shift 2
  if [[ "$PARTS" != *" $name "* ]]; then
    echo "[$name] not selected (PARTS=$PARTS)" | tee -a "$OUT/status.txt"
    return 1
  fi
  local left=$((BUDGET - (SECONDS - START) - 10))
  if (( left < 40 )); then
    echo "[$name] SKIPPED: ${left}s left of the ${BUDGET}s budget" | tee -a "$OUT/status.txt"
    return 1
  fi
  (( limit > left )) && limit=$left
  echo "[$name] start at +$((SECONDS - START))s, limit ${limit}s" | tee -a "$OUT/status.txt"
  local t0=$SECONDS
  timeout --kill-after=20 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  local what=ok
  (( rc == 124 || rc == 137 )) && what="TIMEOUT"
  (( rc != 0 && rc != 124 && rc != 137 )) && what="FAILED"
  echo "[$name] $what (rc=$rc) after $((SECONDS - t0))s" | tee -a "$OUT/status.txt"
  grep -E "^\[$name rank|Error|error:" "$LOGS/$name.log" | tail -n 6
  return $rc
}

# (a) 1 GPU, then DDP on 2 GPUs: same global batch, same STEPS-step schedule.
part one 170 "${LAUNCH[@]}" "${ONE_GPU[@]}" $W run --name one --run-dir "$SCRATCH/one" \
  --steps "$STEPS" --save-at "$SAVE_ONE" "${COMMON[@]}"
part ddp 130 "${LAUNCH[@]}" "${DDP[@]}" $W run --name ddp --run-dir "$SCRATCH/ddp" --distributed ddp \
  --steps "$STEPS" --save-at "$SAVE_ONE" "${COMMON[@]}"

# (b) FSDP on 2 GPUs: from the 1-GPU checkpoint (1 -> 2 processes) to STEPS, checkpoint at SAVE_FSDP.
ONE_CKPT=$SCRATCH/one/checkpoints/step_$SAVE_ONE
if [ -f "$ONE_CKPT/COMPLETE" ]; then
  part fsdp 130 "${LAUNCH[@]}" "${FSDP[@]}" $W run --name fsdp --run-dir "$SCRATCH/fsdp" \
    --resume "$ONE_CKPT" --steps $((STEPS - SAVE_ONE)) --save-at "$SAVE_FSDP" "${COMMON[@]}"
  FSDP_CKPT=$SCRATCH/fsdp/resume0/checkpoints/step_$SAVE_FSDP
else
  echo "[fsdp] no 1-GPU checkpoint: FSDP from scratch (memory and throughput only)" | tee -a "$OUT/status.txt"
  part fsdp 130 "${LAUNCH[@]}" "${FSDP[@]}" $W run --name fsdp --run-dir "$SCRATCH/fsdp" \
    --steps $((STEPS - SAVE_ONE)) --save-at "$((SAVE_FSDP - SAVE_ONE))" "${COMMON[@]}"
  FSDP_CKPT=$SCRATCH/fsdp/checkpoints/step_$((SAVE_FSDP - SAVE_ONE))
fi

# (c) 2 -> 1 process: the DDP and the FSDP checkpoints resumed on 1 GPU (one launch, one target).
CKPTS=()
for c in "$SCRATCH/ddp/checkpoints/step_$SAVE_ONE" "$FSDP_CKPT"; do
  [ -f "$c/COMPLETE" ] && CKPTS+=("$c")
done
N_RESUME=${#CKPTS[@]}
if (( N_RESUME > 0 )); then
  part resume_one 110 "${LAUNCH[@]}" "${ONE_GPU[@]}" $W run --name resume_one --run-dir "$SCRATCH/resume_one" \
    --resume "${CKPTS[@]}" --steps "$RESUME_STEPS" "${COMMON[@]}"
fi
# 1 -> 2 processes under DDP as well, if time is left (FSDP (b) already resumed the 1-GPU checkpoint).
if [ -f "$ONE_CKPT/COMPLETE" ] && (( BUDGET - (SECONDS - START) > 75 )); then
  N_RESUME=$((N_RESUME + 1))
  part resume_ddp 70 "${LAUNCH[@]}" "${DDP[@]}" $W run --name resume_ddp --run-dir "$SCRATCH/resume_ddp" \
    --distributed ddp --resume "$ONE_CKPT" --steps "$RESUME_STEPS" "${COMMON[@]}"
fi

SETTING="Qwen3-8B-shaped"
[ "${DRY_RUN:-0}" = 1 ] && SETTING="DRY RUN on CPU (tiny target and 1-layer draft, fp32, dense attention; figures meaningless), not the Qwen3-8B-shaped"
cat > "$RES/meta.json" <<EOF
{"batch": $BATCH, "warmup": $WARMUP, "save_one": $SAVE_ONE, "resume_parts": $N_RESUME,
 "setting": "$SETTING random bf16 target, 5-layer DFlash2 draft (block 16), global batch $BATCH (grad_accum 1), $LENGTH-token samples, $ANCHORS anchors, bf16 autocast, FlexAttention, $STEPS-step schedule; samples/s exclude the first $WARMUP steps of a run; peak memory is torch.cuda.max_memory_allocated/reserved over the training steps"}
EOF
python3 $W report --results "$RES" --out "$OUT/multi_gpu.md" --tol 0.01 2>&1 | tee "$LOGS/report.log"
echo "total $((SECONDS - START))s; status:"
cat "$OUT/status.txt"
cat "$OUT/multi_gpu.md" 2>/dev/null
