# s18 call 3: GGUF part 2 parked and assembled; the quickstart_gpu drafter
source .session/env.sh; [ -f /tmp/s18.flag ] || { echo "no call-1 state on this machine: stopping"; exit 3; }
python3 scripts/carry.py park .carry/SmolLM2-135M-Instruct.Q4_1.gguf 2>&1 | tail -1
python3 scripts/carry.py assemble /tmp/carry/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/smollm2.gguf 2>&1 | tail -1
t0=$(date +%s); rm -rf /tmp/qs
timeout 300 python3 train/distill.py experiment=quickstart_gpu target.path=/tmp/smollm2.gguf output_dir=/tmp/qs > $OUT/distill_qs.log 2>&1
echo "distill rc $? $(( $(date +%s)-t0 ))s"; tail -c 3000 $OUT/distill_qs.log > $OUT/distill_qs.tail; cp /tmp/qs/metrics.jsonl $OUT/distill_qs_metrics.jsonl 2>/dev/null; rm $OUT/distill_qs.log
tail -c 600 $OUT/distill_qs.tail; ls /tmp/qs/final
