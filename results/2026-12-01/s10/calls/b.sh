# call B: GGUF parts 1-2 + assemble, three drafters in the background, exact-mode and graph GPU tests beside them
set -x; source .session/env.sh
python3 scripts/carry.py park .carry/$G 2>&1 | tail -2
python3 scripts/carry.py assemble /tmp/carry/$G --out /tmp/smollm2.gguf 2>&1 | tail -2 || exit 1
mkdir -p $OUT/b /tmp/logs
T=target.path=/tmp/smollm2.gguf
setsid nohup python3 train/distill.py experiment=quickstart_gpu $T output_dir=/tmp/qs > /tmp/logs/d_qs.log 2>&1 &
setsid nohup python3 train/distill.py experiment=quickstart_gpu data=gsm8k-stdlib $T output_dir=/tmp/qs8s > /tmp/logs/d_qs8s.log 2>&1 &
setsid nohup python3 train/distill.py experiment=quickstart_gpu data=gsm8k-stdlib draft.block_size=16 $T output_dir=/tmp/qs16s > /tmp/logs/d_qs16s.log 2>&1 &
sleep 20; tail -2 /tmp/logs/d_*.log | cut -c1-300
timeout 200 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_exact_mode.py -q --durations=8 > $OUT/b/gpu_exact.log 2>&1; echo "exact rc $?"; tail -4 $OUT/b/gpu_exact.log
timeout 200 python3 -m pytest -p no:cacheprovider -m gpu tests/gpu/test_graphs.py -k "not speed" -q --durations=8 > $OUT/b/gpu_graphs.log 2>&1; echo "graphs rc $?"; tail -4 $OUT/b/gpu_graphs.log
for i in $(seq 1 60); do n=0; for d in qs qs8s qs16s; do [ -f /tmp/$d/final/config.json ] && n=$((n+1)); done; [ $n = 3 ] && break; [ $SECONDS -gt 560 ] && break; sleep 5; done
for d in qs qs8s qs16s; do tail -n 12 /tmp/logs/d_$d.log | cut -c1-200 > $OUT/b/d_$d.tail; du -sh /tmp/$d/final; done
for d in qs qs8s qs16s; do mkdir -p $OUT/b/$d; cp /tmp/$d/final/config.json /tmp/$d/metrics.jsonl $OUT/b/$d/ 2>/dev/null; done
cp /tmp/logs/d_*.log $OUT/b/ 2>/dev/null; gzip $OUT/b/d_*.log
cd $OUT && tar czf b.tgz b && rm -rf b; ls -la $OUT
