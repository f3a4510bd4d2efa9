# batch 2, call 2: GGUF part, the engine benchmark at batch 1 in wall clock against HF + compile (item 1/4 restatement)
source .session/env.sh; [ -f /tmp/batch2.flag ] || { echo "not the batch-2 machine: nothing to continue"; exit 3; }
python3 scripts/carry.py park .carry/SmolLM2-135M-Instruct.Q4_1.gguf 2>&1 | tail -1
timeout 420 python3 -m benchmarks.engine --batch 1 --context 512 --n 15 --new-tokens 64 --compile-level light \
   --linear-impl triton --arms hf_compile,ours --budget-s 380 --out $OUT/engine_b1.md --json $OUT/engine_b1.json > $OUT/engine_b1.log 2>&1
echo "engine rc $?"; head -c 4000 $OUT/engine_b1.md; ls $OUT
