set -x; source .session/env.sh
mkdir -p $OUT/d /tmp/ev
cat > /tmp/evs.sh <<EOT
cd $PWD; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
E="python3 eval/run.py experiment=smollm2_exact_gpu target.path=/tmp/smollm2.gguf"
N16="arms.num_speculative_tokens=[1,3,7,15]"
run() { name=\$1; shift; \$E "\$@" output_dir=/tmp/ev/\$name resume=true > /tmp/ev/\$name.log 2>&1; echo "\$name rc \$?" >> /tmp/ev/rc.txt; }
d=\$1; X=""; [ \$d = mc16 ] && X=\$N16
run \${d}_bs8 draft_path=/tmp/\$d/final \$X &
[ \$d = mc8 ] && run ctl draft_path=/tmp/mc8/final exact=false checks.require_identical=false &
run \${d}_bs1_gsm8k draft_path=/tmp/\$d/final \$X batch_size=1 "data.datasets=[gsm8k]" &
run \${d}_bs1_humaneval draft_path=/tmp/\$d/final \$X batch_size=1 "data.datasets=[humaneval]" &
wait
EOT
for i in $(seq 1 200); do
  for d in mc8 mc16; do
    if [ -f /tmp/$d/final/config.json ] && [ ! -f /tmp/ev/$d.started ]; then touch /tmp/ev/$d.started; setsid nohup bash /tmp/evs.sh $d > /tmp/ev/evs_$d.out 2>&1 & echo "started $d at $SECONDS"; fi
  done
  [ $SECONDS -gt ${STOP:-500} ] && break; sleep 5
done
cat /tmp/ev/rc.txt 2>/dev/null; for f in /tmp/logs/mc*.log; do echo "== $f"; tail -c 250 $f; grep -a "held-out" $f; done
for f in /tmp/ev/*.log; do echo "== $f"; tail -c 300 $f | tr '\r' '\n' | tail -2; done
