set -x; source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -2
python3 scripts/carry.py assemble /tmp/carry/$G --out /tmp/smollm2.gguf 2>&1 | tail -2 || exit 1
mkdir -p $OUT/b /tmp/logs
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
sleep 30; tail -c 400 /tmp/logs/rg.log
timeout 330 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_exact_mode.py -k rows -q --durations=8 > $OUT/b/gpu_exact_rows.log 2>&1; echo "rows rc $?"; tail -6 $OUT/b/gpu_exact_rows.log
tail -c 600 /tmp/logs/rg.log; for f in /tmp/logs/mc*.log; do echo "== $f"; tail -c 400 $f; done
cd $OUT && tar czf b.tgz b && rm -rf b; ls -la $OUT
