# s18 call 1: GGUF part 0 parked; GPU tests on this tree (kernels; graphs + exact head groups); step profile (eager and graph loops)
source .session/env.sh; echo s18 > /tmp/s18.flag
python3 scripts/carry.py park .carry/SmolLM2-135M-Instruct.Q4_1.gguf 2>&1 | tail -1
mkdir -p $OUT/t; export DFLASH2_GPU_OUT=$OUT/t
nvidia-smi -L > $OUT/t/gpu.txt
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels > $OUT/t/kernels.log 2>&1; echo "rc $? $(( $(date +%s)-t0 ))s" >> $OUT/t/kernels.log; tail -3 $OUT/t/kernels.log
t1=$(date +%s)
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_graphs.py tests/gpu/test_exact_head_groups.py -k "not speed" > $OUT/t/gpu.log 2>&1; echo "rc $? $(( $(date +%s)-t1 ))s" >> $OUT/t/gpu.log; tail -3 $OUT/t/gpu.log
t2=$(date +%s); left=$(( 560 - (t2 - t0) )); [ $left -gt 200 ] || left=200
OUT=$OUT/t/sp timeout $left python3 -m benchmarks.step_profile --variants light --cells 1:15 --profile-cells 1:15 \
   --linear-impl triton --profile-loops eager,graphs --budget-s $(( left - 20 )) > $OUT/t/sp.log 2>&1; echo "profile rc $? $(( $(date +%s)-t2 ))s"
grep -h "ms_step\|^profile" $OUT/t/sp.log | cut -c1-160
grep -h -A2 "draft + select" $OUT/t/sp/step_profile.md | grep -h "launches,"
cd $OUT/t && grep -h "passed\|failed\|error" kernels.log gpu.log | tail -8; tar czf ../t.tgz . && cd .. && rm -rf t && ls
