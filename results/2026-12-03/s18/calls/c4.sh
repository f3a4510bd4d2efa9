# s18 call 4: SmolLM2 bf16 tokens/s with the drafter, HF + compile in the same run, batch 1 and 8 (issue 21 item 5)
source .session/env.sh; [ -f /tmp/qs/final/config.json ] || { echo "no drafter /tmp/qs/final on this machine: stopping"; exit 3; }
timeout 470 python3 -m benchmarks.throughput --target /tmp/smollm2.gguf --dtype bfloat16 --draft-path /tmp/qs/final \
   --batch 1,8 --n 3,7 --limit 24 --linear-impl triton --budget-s 440 --out $OUT/tp_smollm2.md --json $OUT/tp_smollm2.json > $OUT/tp_smollm2.log 2>&1
echo "tp135 rc $?"; head -c 6000 $OUT/tp_smollm2.md; tail -c 3000 $OUT/tp_smollm2.log > $OUT/tp_smollm2.tail; rm $OUT/tp_smollm2.log; ls $OUT
