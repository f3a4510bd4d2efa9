# wait loop (sourced): start the drafter's evaluations when it is written; stop at STOP s or when all 7 are done; then status
source .session/env.sh
# a machine that lost its /tmp (taken back, or a fresh one) has no run to wait for: say so at once
[ -f /tmp/train.sh ] || { echo "no /tmp/train.sh: this machine is not the one the run started on; nothing to wait for"; exit 3; }
mkdir -p /tmp/ev /tmp/logs; cp .session/evs.sh /tmp/evs.sh
for i in $(seq 1 400); do
  if [ -f /tmp/q16/final/config.json ] && [ ! -f /tmp/ev/q16.started ]; then touch /tmp/ev/q16.started; setsid nohup bash /tmp/evs.sh $PWD $Q > /tmp/ev/evs_q16.out 2>&1 & echo "started evaluations of q16 at $SECONDS s"; fi
  n=$(cat /tmp/ev/rc.txt 2>/dev/null | wc -l); [ $n -ge 7 ] && break
  grep -q failed /tmp/logs/train.log 2>/dev/null && break   # train.sh failed before the distillation
  [ $SECONDS -gt ${STOP:-540} ] && break; sleep 5
done
echo "== at $SECONDS s"; cat /tmp/logs/train.log 2>/dev/null | tail -3; cat /tmp/qwen.gguf.bfloat16/dequantized.json 2>/dev/null | tr -d "\n"; echo
tail -c 400 /tmp/logs/rg.log 2>/dev/null | tr '\r' '\n' | tail -2; tail -c 300 /tmp/logs/gputests.log 2>/dev/null
[ -f /tmp/logs/q16.log ] && { echo "== q16"; tail -c 3000 /tmp/logs/q16.log | tr '\r' '\n' | grep -av "^\s*$" | tail -3; grep -a "held-out\|Error\|error" /tmp/logs/q16.log | tail -3; }
cat /tmp/ev/rc.txt 2>/dev/null
for f in /tmp/ev/*.log; do [ -f $f ] && echo "$(basename $f): $(tail -c 300 $f | tr '\r' '\n' | grep -av '^\s*$' | tail -1)"; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader; free -g | sed -n 2p
