# call C: last GGUF part, assemble; regenerate 4000 answers (its target load writes the dequantized copy that every later process loads),
# then the block-16 drafter alone (STEPS, default 1500) and, beside it, the row-attention GPU tests; then wait (w.sh)
source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -1
python3 scripts/carry.py assemble /tmp/carry/$G --out /tmp/qwen.gguf 2>&1 | tail -2
[ -f /tmp/qwen.gguf ] || exit 1
mkdir -p /tmp/logs /tmp/ev
cat > /tmp/train.sh <<EOT
cd $PWD; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
T="target=$Q target.path=/tmp/qwen.gguf target.dequantized_cache=true"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_row_attention.py > /tmp/logs/gputests.log 2>&1 &
python3 train/regenerate.py \$T hardware=gpu data=gsm8k-stdlib data.limit=4000 data.max_new_tokens=256 data.regen_batch_size=256 output_dir=/tmp/rg > /tmp/logs/rg.log 2>&1 || { echo 'train.sh failed: regenerate'; exit 2; }
R=data.regenerated=/tmp/rg/regenerated.jsonl
python3 train/distill.py experiment=smollm2_mathcode_gpu \$T \$R train.max_steps=\${STEPS:-1500} draft.block_size=16 output_dir=/tmp/q16 > /tmp/logs/q16.log 2>&1
wait
EOT
setsid nohup bash /tmp/train.sh > /tmp/logs/train.log 2>&1 &
source .session/w.sh
