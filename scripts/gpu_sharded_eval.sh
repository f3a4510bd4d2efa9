#!/usr/bin/env bash
# Sharded evaluation on one 2-GPU machine (issue 11 item 2), one call, < 4 minutes: the same
# eval/run.py config on 1 GPU (accelerate launch --num_processes 1) and sharded over 2 GPUs
# (--num_processes 2), at T=0 and at T=1, both exact=true with batch_size=BATCH > 1 (exact mode
# makes every row independent of its batch neighbours, so different batch compositions on 1 and
# 2 GPUs cannot change a row). The merged records must equal the 1-GPU records on (arm,
# sample_id) x (tokens, accepted, correct, finish_reason) (`dflash2.evaluation.sharding.compare_runs`).
# Writes $OUT/sharded_eval.md (equality per temperature, wall times of 1 vs 2 GPUs, speedup; also
# printed last), $OUT/runs/<t0|t1>_<1|2>gpu/ (records, summary, report), $OUT/logs/*.log,
# $OUT/compare_*.json, $OUT/status.txt.
#
#   OUT=/path bash scripts/gpu_sharded_eval.sh
#   TARGET_OVERRIDES="target=smollm2-135m target.path=$PWD/.gguf/SmolLM2-135M-Instruct.Q4_1.gguf" \
#     DRAFT=path/to/final LIMIT=8 OUT=/path bash scripts/gpu_sharded_eval.sh
#
# Knobs: TARGET_OVERRIDES (Hydra overrides for the target; default: experiment smollm2_gpu's
# SmolLM2-135M, fp32), DRAFT (a draft checkpoint dir; empty = a fresh draft, which accepts ~nothing
# but still runs every code path), LIMIT (items per dataset, default 4: 4 GSM8K + 4 HumanEval +
# 4 MT-Bench x 2 turns), MAX_NEW (default 64), BATCH (default 4), N (draft tokens, default 7),
# BUDGET (seconds for the four launches, default 220).
# The box has no hydra/datasets: scripts/device_env.sh installs the carried wheels (.whl/) first.
# DRY_RUN=1: the same pipeline on CPU (two gloo processes via --multi_gpu, tiny_cpu experiment,
# tiny random target): checks the script, not the figures.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-sharded_eval_out}
mkdir -p "$OUT/logs" "$OUT/runs"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/status.txt"
LIMIT=${LIMIT:-4}
MAX_NEW=${MAX_NEW:-64}
BATCH=${BATCH:-4}
N=${N:-7}
BUDGET=${BUDGET:-220}
DRAFT=${DRAFT:-}
START=$SECONDS

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/sharded_eval.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
# Our own accelerate config dir: a default_config.yaml on the box must not leak into the launches.
export HF_HOME=$SCRATCH/hf
if [ "${DRY_RUN:-0}" = 1 ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 WANDB_MODE=disabled OMP_NUM_THREADS=1
  EXP=(experiment=tiny_cpu stats.n_resamples=50)
  LIMIT=${DRY_LIMIT:-1}
  MAX_NEW=${DRY_MAX_NEW:-8}
  BATCH=2
  N=3
  ONE=(--num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no)
  TWO=(--multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no)
  SETTING="DRY RUN on CPU (2 gloo processes, tiny random target, fresh tiny draft; wall times meaningless)"
else
  # shellcheck disable=SC1091
  source scripts/device_env.sh
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # NVLink multicast off
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
  EXP=(experiment=smollm2_gpu)
  # shellcheck disable=SC2206
  [ -n "${TARGET_OVERRIDES:-}" ] && EXP+=(${TARGET_OVERRIDES})
  ONE=(--num_processes 1 --num_machines 1 --gpu_ids 0 --mixed_precision no --dynamo_backend no)
  TWO=(--multi_gpu --num_processes 2 --num_machines 1 --gpu_ids 0,1 --mixed_precision no --dynamo_backend no)
  SETTING="${TARGET_OVERRIDES:-SmolLM2-135M fp32 (experiment smollm2_gpu)}"
fi
LAUNCH=(python3 -m accelerate.commands.launch)
ARGS=("${EXP[@]}" "data.limit=$LIMIT" "max_new_tokens=$MAX_NEW" "batch_size=$BATCH" exact=true
      "arms.num_speculative_tokens=[$N]" "arms.oracle_num_speculative_tokens=[$N]" arms.oracle=true logger=disabled)
if [ -n "$DRAFT" ]; then
  ARGS+=("draft_path=$DRAFT")
  SETTING="$SETTING, draft $DRAFT"
else
  ARGS+=(arms.selector_off=false)   # a fresh draft's selector is the identity: nothing to compare
  SETTING="$SETTING, fresh (untrained) draft"
fi

{
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, accelerate; print('torch', torch.__version__, 'accelerate', accelerate.__version__, 'gpus', torch.cuda.device_count())"
  echo "args: ${ARGS[*]}"
} 2>&1 | tee "$OUT/env.txt"

run() {   # run NAME LAUNCHER_ARGS_VAR T: one eval launch, wall time to $OUT/logs/NAME.wall
  local name=$1 t=$3
  local -n largs=$2
  local left=$((BUDGET - (SECONDS - START)))
  if (( left < 20 )); then
    echo "[$name] SKIPPED: ${left}s left of the ${BUDGET}s budget" | tee -a "$OUT/status.txt"
    return 1
  fi
  rm -rf "$OUT/runs/$name"
  local t0 rc
  t0=$(date +%s.%N)
  timeout --kill-after=15 "$left" "${LAUNCH[@]}" "${largs[@]}" eval/run.py "${ARGS[@]}" "temperature=$t" \
    "output_dir=$OUT/runs/$name" > "$OUT/logs/$name.log" 2>&1
  rc=$?
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$(date +%s.%N)" \
    > "$OUT/logs/$name.wall"
  echo "[$name] rc=$rc wall $(cat "$OUT/logs/$name.wall")s" | tee -a "$OUT/status.txt"
  (( rc != 0 )) && tail -n 15 "$OUT/logs/$name.log"
  return $rc
}

for t in 0 1; do
  run "t${t}_1gpu" ONE "$t"
  run "t${t}_2gpu" TWO "$t"
done

python3 - "$OUT" "$SETTING" <<'PY'
import json, sys
from pathlib import Path
from dflash2.evaluation.sharding import compare_runs

out, setting = Path(sys.argv[1]), sys.argv[2]

def gen_time(run: Path) -> float:
    """Generation time on the critical path: per process, the sum of its records' wall_s; max over processes."""
    per = {}
    for line in (run / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        per[r.get("rank", 0)] = per.get(r.get("rank", 0), 0.0) + float(r["wall_s"])
    return max(per.values())

rows, ok = [], True
for t in (0, 1):
    a, b = out / "runs" / f"t{t}_1gpu", out / "runs" / f"t{t}_2gpu"
    walls = [(out / "logs" / f"t{t}_{k}gpu.wall") for k in (1, 2)]
    w1, w2 = (float(w.read_text()) if w.exists() else float("nan") for w in walls)
    try:
        c = compare_runs(a, b)
    except (FileNotFoundError, ValueError) as e:
        rows.append(f"| {t} | run missing ({e}) | | | | | | |")
        ok = False
        continue
    (out / f"compare_t{t}.json").write_text(json.dumps(c, indent=1))
    g1, g2 = gen_time(a), gen_time(b)
    ok &= c["equal"] and c["ranks_b"] == [0, 1]
    rows.append(f"| {t} | {'EQUAL' if c['equal'] else 'DIFFER'} ({c['n_equal']}/{c['n_compared']} equal, "
                f"{c['n_a']} vs {c['n_b']} records) | {c['ranks_b']} | {w1:.1f} | {w2:.1f} | {w1 / w2:.2f}x "
                f"| {g1:.1f} / {g2:.1f} | {g1 / g2:.2f}x |")
md = [f"# Sharded evaluation: 1 GPU vs 2 GPUs ({'PASS' if ok else 'FAIL'})", "",
      f"Setting: {setting}; exact=true, batch_size > 1, same config and per-sample seeds on both sides. "
      "Equal = same (arm, sample_id) set, no duplicates, and equal tokens, accepted, correct, finish_reason.",
      "Wall = the whole launch (imports, target load, warmup, generation, merge, summary, report); "
      "generation = per process the sum of its records' wall_s, max over processes.", "",
      "| T | merged records vs 1 GPU | ranks | wall 1 GPU (s) | wall 2 GPUs (s) | wall speedup "
      "| generation 1 / 2 GPUs (s) | generation speedup |",
      "|---|---|---|---|---|---|---|---|", *rows]
(out / "sharded_eval.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if ok else 1)
PY
rc=$?
echo "total $((SECONDS - START))s; status:"
cat "$OUT/status.txt"
exit $rc
