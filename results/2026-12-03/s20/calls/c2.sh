# s20 call 2: the gate twice (two processes), with per-call wall times, the pipelined step readings and
# the replay launch times logged per cell (stderr line per cell)
source .session/env.sh;  # = calls/env.sh
[ -f /tmp/s20.flag ] && echo "(warm machine)" || echo "(fresh machine)"; echo s20 > /tmp/s20.flag
mkdir -p $OUT/t; nvidia-smi -L > $OUT/t/gpu.txt; nproc > $OUT/t/nproc.txt; uptime >> $OUT/t/nproc.txt
t0=$(date +%s)
for r in 1 2; do
  t1=$(date +%s)
  timeout 270 python3 -m benchmarks.engine --batch 1 --context 512 --n 15 --new-tokens 64 --compile-level light \
     --linear-impl triton --arms hf_compile,ours --out $OUT/t/engine_b1_r$r.md --json $OUT/t/engine_b1_r$r.json > $OUT/t/engine_b1_r$r.log 2>&1
  echo "engine b1 run $r rc $? $(( $(date +%s)-t1 ))s"; grep -A5 "| batch | arm" $OUT/t/engine_b1_r$r.md | tail -3 | cut -d'|' -f2-10
  grep "ms/step\|: ok" $OUT/t/engine_b1_r$r.log | grep -v "^|" | cut -c1-400
  grep "gate" $OUT/t/engine_b1_r$r.md
done
uptime
