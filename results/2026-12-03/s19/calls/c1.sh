# s19 call 1: small-matrix tiling sweep (k/v-sized 1024x4096 = the draft's kernel projections, q/o 4096x4096);
# step profile of HEAD (eager loop) to measure 6c51eb0's stacked buffer and embedding gather
source .session/env.sh;  # = calls/env.sh
 echo s19 > /tmp/s19.flag
mkdir -p $OUT/t; nvidia-smi -L > $OUT/t/gpu.txt
t0=$(date +%s)
timeout 150 python3 -m benchmarks.linear --sweep --shapes k_v --rows 1 16 32 --no-stack --wide-rows \
  --block-n 16 32 64 --block-k 128 256 --splits 2 4 8 16 --stages 4 5 --out $OUT/t/sweep_kv.json > $OUT/t/sweep_kv.log 2>&1
echo "sweep kv rc $? $(( $(date +%s)-t0 ))s"; tail -8 $OUT/t/sweep_kv.log
timeout 140 python3 -m benchmarks.linear --sweep --shapes q_o --rows 1 16 32 --no-stack --wide-rows \
  --block-n 32 64 128 --block-k 128 256 --splits 1 2 4 --stages 4 5 --out $OUT/t/sweep_qo.json > $OUT/t/sweep_qo.log 2>&1
echo "sweep qo rc $? $(( $(date +%s)-t0 ))s"; tail -8 $OUT/t/sweep_qo.log
t2=$(date +%s); left=$(( 570 - (t2 - t0) )); [ $left -gt 150 ] || left=150
OUT=$OUT/t/sp timeout $left python3 -m benchmarks.step_profile --variants light --cells 1:15 --profile-cells 1:15 \
   --linear-impl triton --profile-loops eager --budget-s $(( left - 20 )) > $OUT/t/sp.log 2>&1; echo "profile rc $? $(( $(date +%s)-t2 ))s"
grep -h "ms_step\|^profile" $OUT/t/sp.log | cut -c1-160
grep -h -A2 "draft + select" $OUT/t/sp/step_profile.md | grep -h "launches,"
