# s19 call 4: the engine benchmark in wall clock: batch 1 (AR, N = 15) against HF + compile; batch 8 / 32 spec / AR
source .session/env.sh;  # = calls/env.sh
 [ -f /tmp/s19.flag ] || echo "(fresh machine)"
mkdir -p $OUT/t; t0=$(date +%s)
timeout 200 python3 -m benchmarks.engine --batch 1 --context 512 --n 15 --new-tokens 64 --compile-level light \
   --linear-impl triton --arms hf_compile,ours --budget-s 190 --out $OUT/t/engine_b1.md --json $OUT/t/engine_b1.json > $OUT/t/engine_b1.log 2>&1
echo "engine b1 rc $? $(( $(date +%s)-t0 ))s"; grep -A8 "| batch | arm" $OUT/t/engine_b1.md | head -12
t1=$(date +%s); left=$(( 370 - (t1 - t0) )); [ $left -gt 60 ] || left=60
timeout $left python3 -m benchmarks.engine --batch 8,32 --context 512 --n 3,7 --new-tokens 64 --compile-level light \
   --linear-impl triton --arms ours --budget-s $(( left - 15 )) --out $OUT/t/engine_b8_32.md --json $OUT/t/engine_b8_32.json > $OUT/t/engine_b8_32.log 2>&1
echo "engine b8/32 rc $? $(( $(date +%s)-t1 ))s"; grep -A12 "| batch | arm" $OUT/t/engine_b8_32.md | head -16
