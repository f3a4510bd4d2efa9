# batch 2, call 3: last GGUF part + assemble; item 5's 8B batch-8 table with HF + compile in the same run
source .session/env.sh; [ -f /tmp/batch2.flag ] || { echo "not the batch-2 machine: nothing to continue"; exit 3; }
python3 scripts/carry.py park .carry/SmolLM2-135M-Instruct.Q4_1.gguf 2>&1 | tail -1
python3 scripts/carry.py assemble /tmp/carry/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/smollm2.gguf 2>&1 | tail -1
timeout 440 python3 -m benchmarks.throughput --shape qwen3-8b --batch 8 --n 7,15 --accept 0.6,0.8,0.9 --repeats 3 \
   --compile-level light --linear-impl triton --budget-s 400 --out $OUT/tp8b_b8.md --json $OUT/tp8b_b8.json > $OUT/tp8b_b8.log 2>&1
echo "tp8b rc $?"; head -c 5000 $OUT/tp8b_b8.md; tail -c 1500 $OUT/tp8b_b8.log > $OUT/tp8b_b8.tail; rm $OUT/tp8b_b8.log; ls $OUT
