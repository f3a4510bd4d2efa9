# batch 2, call 5: SmolLM2 bf16 tokens/s with the drafter, HF + compile in the same run, batch 1 and 8
source .session/env.sh; [ -f /tmp/qs/final/config.json ] || { echo "no drafter /tmp/qs/final on this machine: nothing to continue"; exit 3; }
timeout 380 python3 -m benchmarks.throughput --target /tmp/smollm2.gguf --dtype bfloat16 --draft-path /tmp/qs/final \
   --batch 1,8 --n 3,7 --limit 32 --linear-impl triton --budget-s 330 --out $OUT/tp_smollm2.md --json $OUT/tp_smollm2.json > $OUT/tp_smollm2.log 2>&1
echo "tp135 rc $?"; head -c 5000 $OUT/tp_smollm2.md; tail -c 2000 $OUT/tp_smollm2.log > $OUT/tp_smollm2.tail; rm $OUT/tp_smollm2.log; ls $OUT
