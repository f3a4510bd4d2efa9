# wait loop (sourced): start each drafter's evaluations when it is written; stop at STOP s or when all 11 are done; then status
source .session/env.sh
mkdir -p /tmp/ev /tmp/logs; cp .session/evs.sh /tmp/evs.sh
for i in $(seq 1 400); do
  for d in q8 q16; do
    if [ -f /tmp/$d/final/config.json ] && [ ! -f /tmp/ev/$d.started ]; then touch /tmp/ev/$d.started; setsid nohup bash /tmp/evs.sh $d $PWD > /tmp/ev/evs_$d.out 2>&1 & echo "started evaluations of $d at $SECONDS s"; fi
  done
  n=$(cat /tmp/ev/rc.txt 2>/dev/null | wc -l); [ $n -ge 11 ] && break
  grep -q failed /tmp/logs/train.log 2>/dev/null && break   # train.sh failed before the distills
  [ $SECONDS -gt ${STOP:-540} ] && break; sleep 5
done
echo "== at $SECONDS s"; cat /tmp/logs/train.log 2>/dev/null | tail -3; cat /tmp/logs/convert.log 2>/dev/null | grep -v "Converting\|Loading\|Writing" | tail -3
tail -c 400 /tmp/logs/rg.log 2>/dev/null | tr '\r' '\n' | tail -2
for d in q8 q16; do [ -f /tmp/logs/$d.log ] && { echo "== $d"; tail -c 3000 /tmp/logs/$d.log | tr '\r' '\n' | grep -v "^\s*$" | tail -3; grep -a "held-out\|Error\|error" /tmp/logs/$d.log | tail -3; }; done
cat /tmp/ev/rc.txt 2>/dev/null
for f in /tmp/ev/*.log; do [ -f $f ] && echo "$(basename $f): $(tail -c 300 $f | tr '\r' '\n' | grep -v '^\s*$' | tail -1)"; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader; free -g | sed -n 2p
