# s20 call 3: the gate with the loop's collector paused (engine benchmark batch 1, HF static + compile and ours,
# GC pauses logged per cell), the graph + exact GPU tests on this tree, then the gate once more (a second process)
source .session/env.sh;  # = calls/env.sh
[ -f /tmp/s20.flag ] && echo "(warm machine)" || echo "(fresh machine)"; echo s20 > /tmp/s20.flag
mkdir -p $OUT/t; export DFLASH2_GPU_OUT=$OUT/t; nvidia-smi -L > $OUT/t/gpu.txt
t0=$(date +%s)
gate() {
  t1=$(date +%s)
  timeout $(( 580 - ($(date +%s) - t0) > 250 ? 250 : 580 - ($(date +%s) - t0) )) python3 -m benchmarks.engine --batch 1 --context 512 --n 15 --new-tokens 64 --compile-level light \
     --linear-impl triton --arms hf_compile,ours --out $OUT/t/engine_b1_r$1.md --json $OUT/t/engine_b1_r$1.json > $OUT/t/engine_b1_r$1.log 2>&1
  echo "engine b1 run $1 rc $? $(( $(date +%s)-t1 ))s"
  grep -o '\(ours\|HF\) [^|]*ms\/step.*' $OUT/t/engine_b1_r$1.log | cut -c1-420
  grep "gate" $OUT/t/engine_b1_r$1.md
}
gate 1
t1=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_graphs.py tests/gpu/test_exact_head_groups.py -k "not speed" > $OUT/t/gpu.log 2>&1
echo "graphs+exact rc $? $(( $(date +%s)-t1 ))s"; tail -2 $OUT/t/gpu.log | cut -c1-300
left=$(( 580 - ($(date +%s) - t0) )); echo "left ${left}s"
[ $left -gt 130 ] && gate 2
