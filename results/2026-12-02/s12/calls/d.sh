# call D: evaluations start as each drafter is written; progress
source .session/env.sh
mkdir -p /tmp/ev
for i in $(seq 1 200); do
  for d in mc8 mc16; do
    if [ -f /tmp/$d/final/config.json ] && [ ! -f /tmp/ev/$d.started ]; then touch /tmp/ev/$d.started; setsid nohup bash .session/evs.sh $d $PWD > /tmp/ev/evs_$d.out 2>&1 & echo "started $d at $SECONDS"; fi
  done
  [ -f /tmp/ev/mc16.started ] && [ $SECONDS -gt ${MIN:-0} ] && break
  [ $SECONDS -gt ${STOP:-500} ] && break; sleep 5
done
cat /tmp/ev/rc.txt 2>/dev/null; for f in /tmp/logs/mc*.log; do echo "== $f"; tail -c 250 $f | tr '\r' '\n' | tail -2; grep -a "held-out" $f | tail -2; done
for f in /tmp/ev/*.log; do echo "== $f"; tail -c 300 $f | tr '\r' '\n' | tail -1; done
