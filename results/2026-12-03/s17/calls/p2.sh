# batch 1, call 2: step profile A/B, same machine: the base tree (f5029a9) and this tree with PDL linears off/on
source .session/env.sh; mkdir -p $OUT/s; t0=$(date +%s)
( cd .session/base && OUT=$OUT/s/base PYTHONPATH=/tmp/site:. timeout 200 python3 -m benchmarks.step_profile --variants light \
   --cells 1:0,1:15 --profile-cells 1:15 --linear-impl triton --budget-s 150 > $OUT/s/base.log 2>&1; echo "base rc $? $(( $(date +%s)-t0 ))s" )
t1=$(date +%s); left=$(( 570 - (t1 - t0) ))
OUT=$OUT/s/new timeout $left python3 -m benchmarks.step_profile --variants light --cells 1:0,1:15 --profile-cells 1:15 \
   --linear-impl triton --linear-pdl 0,1 --budget-s $(( left - 40 )) > $OUT/s/new.log 2>&1; echo "new rc $? $(( $(date +%s)-t1 ))s"
grep -h "ms_step\|profile" $OUT/s/base.log $OUT/s/new.log | cut -c1-200
cd $OUT/s && tar czf ../sp.tgz . && cd .. && rm -rf s && ls
