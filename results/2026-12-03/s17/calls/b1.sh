# batch 2, call 1: GGUF part, step profile A/B of the stacked context+block projection (base f5029a9 vs this tree)
source .session/env.sh; echo batch2 > /tmp/batch2.flag
python3 scripts/carry.py park .carry/SmolLM2-135M-Instruct.Q4_1.gguf 2>&1 | tail -1
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null; nvidia-smi -L >> $OUT/commit.txt
mkdir -p $OUT/s; t0=$(date +%s)
( cd .session/base && OUT=$OUT/s/base PYTHONPATH=/tmp/site:. timeout 150 python3 -m benchmarks.step_profile --variants light \
   --cells 1:15 --profile-cells 1:15 --linear-impl triton --budget-s 120 > $OUT/s/base.log 2>&1; echo "base rc $? $(( $(date +%s)-t0 ))s" )
t1=$(date +%s)
OUT=$OUT/s/new timeout 150 python3 -m benchmarks.step_profile --variants light --cells 1:15 --profile-cells 1:15 \
   --linear-impl triton --budget-s 120 > $OUT/s/new.log 2>&1; echo "new rc $? $(( $(date +%s)-t1 ))s"
grep -h "ms_step\|^profile" $OUT/s/base.log $OUT/s/new.log | cut -c1-160
cd $OUT/s && tar czf ../sp2.tgz . && cd .. && rm -rf s && ls
