# collect: records, summaries, drafter metrics and hashes, log tails (compare on the CPU)
source .session/env.sh; mkdir -p $OUT/e
[ -f /tmp/train.sh ] || { echo "no /tmp/train.sh: nothing of the run on this machine"; exit 3; }
for d in q8 q16; do mkdir -p $OUT/e/$d; cp /tmp/$d/final/config.json /tmp/$d/metrics.jsonl $OUT/e/$d/ 2>/dev/null; sha256sum /tmp/$d/final/*.safetensors > $OUT/e/$d/sha256.txt 2>/dev/null; done
cp /tmp/qwen.gguf.bfloat16/dequantized.json $OUT/e/ 2>/dev/null; tail -c 3000 /tmp/logs/rg.log > $OUT/e/rg.tail 2>/dev/null
tar czf $OUT/e/ev.tgz -C /tmp --exclude='*.log' ev; for f in /tmp/ev/*.log /tmp/logs/*.log; do tail -c 20000 $f > $OUT/e/$(basename $f); done
cd $OUT && tar czf e.tgz e && rm -rf e; ls -la $OUT
