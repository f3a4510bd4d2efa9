# batch 2, call 4: the quickstart_gpu drafter on the SmolLM2 target (item 5's SmolLM2 table)
source .session/env.sh; [ -f /tmp/smollm2.gguf ] || { echo "no /tmp/smollm2.gguf on this machine: nothing to continue"; exit 3; }
timeout 560 python3 train/distill.py experiment=quickstart_gpu target.path=/tmp/smollm2.gguf output_dir=/tmp/qs > /tmp/distill_qs.log 2>&1
echo "distill rc $?"; tail -n 6 /tmp/distill_qs.log; cp /tmp/qs/metrics.jsonl $OUT/ 2>/dev/null; tail -c 3000 /tmp/distill_qs.log > $OUT/distill_qs.tail; ls $OUT
