# s19 call 3: graph + exact GPU tests on this tree; step profile (eager) of this tree
source .session/env.sh; echo s19 > /tmp/s19.flag
mkdir -p $OUT/t; export DFLASH2_GPU_OUT=$OUT/t; nvidia-smi -L > $OUT/t/gpu.txt
t0=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_graphs.py tests/gpu/test_exact_head_groups.py -k "not speed" > $OUT/t/gpu.log 2>&1
echo "graphs+exact rc $? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/t/gpu.log
t2=$(date +%s); left=$(( 575 - (t2 - t0) )); [ $left -gt 140 ] || left=140
OUT=$OUT/t/sp timeout $left python3 -m benchmarks.step_profile --variants light --cells 1:15 --profile-cells 1:15 \
   --linear-impl triton --profile-loops eager --budget-s $(( left - 20 )) > $OUT/t/sp.log 2>&1; echo "profile rc $? $(( $(date +%s)-t2 ))s"
grep -h "ms_step\|^profile\|^draft + select" $OUT/t/sp.log | cut -c1-200
