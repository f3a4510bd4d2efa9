# s19 call 2: kernel tests on the GPU (the gpu-marked suite, plus norm-RoPE, selector and row-attention
# small-shape tests compiled); graph + exact GPU tests; row-attention split sweep (q 1, 8, 16; batch 1, 8); step profile of this tree
source .session/env.sh;  # = calls/env.sh
 echo s19 > /tmp/s19.flag
mkdir -p $OUT/t; export DFLASH2_GPU_OUT=$OUT/t; nvidia-smi -L > $OUT/t/gpu.txt
t0=$(date +%s)
timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels > $OUT/t/kernels_gpu.log 2>&1
echo "gpu-marked rc $? $(( $(date +%s)-t0 ))s"; tail -2 $OUT/t/kernels_gpu.log
t1=$(date +%s)
timeout 60 python3 -m pytest -q -p no:cacheprovider -m '' tests/kernels/test_norm_rope.py tests/kernels/test_selector.py \
  tests/kernels/test_row_attention.py > $OUT/t/kernels_small.log 2>&1
echo "small shapes rc $? $(( $(date +%s)-t1 ))s"; tail -2 $OUT/t/kernels_small.log
t1=$(date +%s)
timeout 190 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_graphs.py tests/gpu/test_exact_head_groups.py -k "not speed" > $OUT/t/gpu.log 2>&1
echo "graphs+exact rc $? $(( $(date +%s)-t1 ))s"; tail -2 $OUT/t/gpu.log
t1=$(date +%s)
timeout 100 python3 -m benchmarks.kernels --batches 1 8 --sweep --sweep-kernels row_attention --out $OUT/t/attn_sweep.md > $OUT/t/attn_sweep.log 2>&1
echo "sweep rc $? $(( $(date +%s)-t1 ))s"; grep "| row_attention | 1 | q16\|| row_attention | 1 | q8 \|| row_attention | 8 | q16" $OUT/t/attn_sweep.md | grep -v merge | head -40
t2=$(date +%s); left=$(( 585 - (t2 - t0) )); [ $left -gt 100 ] || left=100
OUT=$OUT/t/sp timeout $left python3 -m benchmarks.step_profile --variants light --cells 1:15 --profile-cells 1:15 \
   --linear-impl triton --profile-loops eager --budget-s $(( left - 20 )) > $OUT/t/sp.log 2>&1; echo "profile rc $? $(( $(date +%s)-t2 ))s"
grep -h "ms_step\|^profile\|^draft + select" $OUT/t/sp.log | cut -c1-200
