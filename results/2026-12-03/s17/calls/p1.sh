# batch 1, call 1: GPU tests on the current tree (kernels incl. PDL, graphs incl. PDL tokens, exact head groups), kernel bench
source .session/env.sh; mkdir -p $OUT/t; export DFLASH2_GPU_OUT=$OUT/t
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/t/gpu.txt
t0=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels > $OUT/t/kernels.log 2>&1; echo "rc $? $(( $(date +%s)-t0 ))s" >> $OUT/t/kernels.log; tail -4 $OUT/t/kernels.log
t1=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_graphs.py tests/gpu/test_exact_head_groups.py -k "not speed" > $OUT/t/gpu.log 2>&1; echo "rc $? $(( $(date +%s)-t1 ))s" >> $OUT/t/gpu.log; tail -4 $OUT/t/gpu.log
t2=$(date +%s); left=$(( 560 - (t2 - t0) ))
[ $left -gt 60 ] && timeout $left python3 -m benchmarks.kernels --batches 1 8 --out $OUT/t/kernels_bench.md > $OUT/t/kernels_bench.log 2>&1; echo "bench rc $? $(( $(date +%s)-t2 ))s"
cd $OUT/t && grep -h "passed\|failed\|error" kernels.log gpu.log | tail -6; tar czf ../t.tgz . && cd .. && rm -rf t && ls
