# one call on a fresh machine: the head-group exact test at the Qwen2.5-0.5B layout, then the 8B exact and graph tests on the current kernels
source .session/env.sh > $OUT/env.log 2>&1
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null; git status --short >> $OUT/commit.txt
export DFLASH2_GPU_OUT=$OUT
t0=$SECONDS
timeout 170 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_exact_head_groups.py -v -s > $OUT/head_groups.log 2>&1; echo "head_groups rc $? at $((SECONDS-t0)) s"
timeout 170 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_exact_mode.py -k invariant -v > $OUT/exact_mode.log 2>&1; echo "exact_mode rc $? at $((SECONDS-t0)) s"
timeout 130 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_graphs.py -k "not speed" -v > $OUT/graphs.log 2>&1; echo "graphs rc $? at $((SECONDS-t0)) s"
for f in head_groups exact_mode graphs; do echo "== $f"; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|Error" $OUT/$f.log | tail -14; done
