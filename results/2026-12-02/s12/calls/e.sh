# call E: wait for the evaluations (STOP seconds at most), then collect and compare
source .session/env.sh
mkdir -p $OUT/e
for i in $(seq 1 120); do n=$(cat /tmp/ev/rc.txt 2>/dev/null | wc -l); [ $n -ge 11 ] && break; [ $SECONDS -gt ${STOP:-400} ] && break; sleep 5; done
cat /tmp/ev/rc.txt 2>/dev/null
for f in /tmp/ev/*.log; do echo "== $f"; tail -c 1500 $f | tr '\r' '\n' | grep -v "samples x arms" | tail -8; done
for d in mc8 mc16; do grep -a "held-out\|step 2000" /tmp/logs/$d.log | tail -4; mkdir -p $OUT/e/$d; cp /tmp/$d/final/config.json /tmp/$d/metrics.jsonl $OUT/e/$d/ 2>/dev/null; sha256sum /tmp/$d/final/*.safetensors > $OUT/e/$d/sha256.txt; done
for d in mc8 mc16; do for r in /tmp/ev/${d}_b1_*; do [ -d $r ] && echo "same-tokens $d bs8 vs $(basename $r)" && python3 eval/report.py --same-tokens /tmp/ev/${d}_bs8 $r 2>&1 | tail -3; done; done
tail -c 2000 /tmp/logs/rg.log > $OUT/e/rg.tail
tar czf /tmp/ev.tgz -C /tmp --exclude='*.log' ev; cp /tmp/ev.tgz $OUT/e/; for f in /tmp/ev/*.log /tmp/logs/*.log; do tail -c 20000 $f > $OUT/e/$(basename $f); done
cd $OUT && tar czf e.tgz e && rm -rf e; ls -la $OUT
