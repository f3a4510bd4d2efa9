set -x; source .session/env.sh
mkdir -p $OUT/c
timeout 280 python3 -m pytest -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_norm_rope.py tests/kernels/test_linear.py tests/kernels/test_row_attention.py tests/engine/test_draft_norm_rope.py -q --durations=8 > $OUT/c/gpu_kernels.log 2>&1; echo "kernels rc $?"; tail -8 $OUT/c/gpu_kernels.log
for f in /tmp/logs/mc*.log; do echo "== $f"; tail -c 300 $f; grep -a "held-out" $f; done
cd $OUT && tar czf c.tgz c && rm -rf c; ls -la $OUT
