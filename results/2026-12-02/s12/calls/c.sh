# call C: GGUF part 2, assemble; regenerate, then both drafters distilled in the background; GPU kernel and graph tests beside
set -x; source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -2
python3 scripts/carry.py assemble /tmp/carry/$G --out /tmp/smollm2.gguf 2>&1 | tail -2
[ -f /tmp/smollm2.gguf ] || exit 1
mkdir -p $OUT/c /tmp/logs
T=target.path=/tmp/smollm2.gguf
R=data.regenerated=/tmp/rg/regenerated.jsonl
cat > /tmp/train.sh <<EOT
cd $PWD; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
python3 train/regenerate.py target=smollm2-135m $T hardware=gpu data=gsm8k-stdlib data.limit=4000 data.max_new_tokens=256 data.regen_batch_size=256 output_dir=/tmp/rg > /tmp/logs/rg.log 2>&1 || exit 1
python3 train/distill.py experiment=smollm2_mathcode_gpu $T $R output_dir=/tmp/mc8 > /tmp/logs/mc8.log 2>&1 &
python3 train/distill.py experiment=smollm2_mathcode_gpu $T $R draft.block_size=16 output_dir=/tmp/mc16 > /tmp/logs/mc16.log 2>&1 &
wait
EOT
setsid nohup bash /tmp/train.sh > /tmp/logs/train.log 2>&1 &
timeout 200 python3 -m pytest -p no:cacheprovider -m "gpu or not gpu" tests/kernels/test_norm_rope.py tests/kernels/test_linear.py tests/kernels/test_row_attention.py tests/engine/test_draft_norm_rope.py -q --durations=8 > $OUT/c/gpu_kernels.log 2>&1; echo "kernels rc $?"; tail -8 $OUT/c/gpu_kernels.log
timeout 200 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_graphs.py -k "not speed" -q --durations=5 > $OUT/c/gpu_graphs.log 2>&1; echo "graphs rc $?"; tail -6 $OUT/c/gpu_graphs.log
tail -c 600 /tmp/logs/rg.log | tr '\r' '\n' | tail -4; for f in /tmp/logs/mc*.log; do echo "== $f"; tail -c 300 $f | tr '\r' '\n' | tail -2; done
