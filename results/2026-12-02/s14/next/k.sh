# collect: records, summaries, drafter metrics and hashes, log tails (compare on the CPU)
source .session/env.sh; mkdir -p $OUT/e
[ -f /tmp/train.sh ] || { echo "no /tmp/train.sh: nothing of the run on this machine"; exit 3; }
mkdir -p $OUT/e/q16; cp /tmp/q16/final/config.json /tmp/q16/metrics.jsonl $OUT/e/q16/ 2>/dev/null; sha256sum /tmp/q16/final/*.safetensors > $OUT/e/q16/sha256.txt 2>/dev/null
cp /tmp/qwen.gguf.bfloat16/dequantized.json $OUT/e/ 2>/dev/null; tail -c 3000 /tmp/logs/rg.log > $OUT/e/rg.tail 2>/dev/null
tar czf $OUT/e/ev.tgz -C /tmp --exclude='*.log' ev; for f in /tmp/ev/*.log /tmp/logs/*.log; do tail -c 20000 $f > $OUT/e/$(basename $f); done
cd $OUT && tar czf e.tgz e && rm -rf e; ls -la $OUT
