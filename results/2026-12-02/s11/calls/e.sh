source .session/env.sh
mkdir -p $OUT/e
for i in $(seq 1 60); do [ $SECONDS -gt ${STOP:-270} ] && break; sleep 5; done
cat /tmp/ev/rc.txt 2>/dev/null
for f in /tmp/ev/*.log; do echo "== $f"; tail -c 1500 $f | tr '\r' '\n' | grep -v "samples x arms" | tail -12; tail -c 200 $f | tr '\r' '\n' | tail -1; done
for d in mc8 mc16; do grep -a "held-out\|step 2000" /tmp/logs/$d.log | tail -4; mkdir -p $OUT/e/$d; cp /tmp/$d/final/config.json /tmp/$d/metrics.jsonl $OUT/e/$d/ 2>/dev/null; done
tail -c 2000 /tmp/logs/rg.log > $OUT/e/rg.tail
tar czf /tmp/ev.tgz -C /tmp --exclude='*.log' ev; cp /tmp/ev.tgz $OUT/e/; for f in /tmp/ev/*.log; do tail -c 20000 $f > $OUT/e/$(basename $f); done
cd $OUT && tar czf e.tgz e && rm -rf e; ls -la $OUT
