# s20 call 1: the gate on HEAD (engine benchmark, batch 1: HF static + compile and ours AR / N = 15, same run,
# default budget); then the gpu-marked kernel tests and the graph + exact GPU tests on HEAD
source .session/env.sh;  # = calls/env.sh
echo s20 > /tmp/s20.flag
mkdir -p $OUT/t; export DFLASH2_GPU_OUT=$OUT/t; nvidia-smi -L > $OUT/t/gpu.txt; git log --oneline -1 > $OUT/t/tree.txt 2>/dev/null
t0=$(date +%s)
timeout 260 python3 -m benchmarks.engine --batch 1 --context 512 --n 15 --new-tokens 64 --compile-level light \
   --linear-impl triton --arms hf_compile,ours --out $OUT/t/engine_b1.md --json $OUT/t/engine_b1.json > $OUT/t/engine_b1.log 2>&1
echo "engine b1 rc $? $(( $(date +%s)-t0 ))s"; grep -A6 "| batch | arm" $OUT/t/engine_b1.md | head -8
grep -A8 "^| target" $OUT/t/engine_b1.md | head -10
t1=$(date +%s)
timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels > $OUT/t/kernels_gpu.log 2>&1
echo "gpu-marked kernels rc $? $(( $(date +%s)-t1 ))s"; tail -2 $OUT/t/kernels_gpu.log
t1=$(date +%s); left=$(( 585 - (t1 - t0) )); [ $left -gt 60 ] || left=60
timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_graphs.py tests/gpu/test_exact_head_groups.py -k "not speed" > $OUT/t/gpu.log 2>&1
echo "graphs+exact rc $? $(( $(date +%s)-t1 ))s"; tail -2 $OUT/t/gpu.log
