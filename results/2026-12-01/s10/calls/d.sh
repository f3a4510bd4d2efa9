set -x; source .session/env.sh
mkdir -p $OUT/d /tmp/ev
timeout 220 python3 -m benchmarks.throughput --target /tmp/smollm2.gguf --dtype bfloat16 --draft-path /tmp/qs/final --batch 1,8 --n 3,7 --limit 32 --linear-impl triton --profile --budget-s 205 --out $OUT/d/tp_smollm2.md --json $OUT/d/tp_smollm2.json > $OUT/d/tp_smollm2.log 2>&1; echo "tp135 rc $?"; head -50 $OUT/d/tp_smollm2.md; tail -5 $OUT/d/tp_smollm2.log
E="python3 eval/run.py experiment=smollm2_exact_gpu target.path=/tmp/smollm2.gguf"
timeout 300 $E draft_path=/tmp/qs8s/final output_dir=/tmp/ev/b8_bs8 > $OUT/d/ev_b8_bs8.log 2>&1 &
timeout 300 $E draft_path=/tmp/qs16s/final output_dir=/tmp/ev/b16_bs8 'arms.num_speculative_tokens=[1,3,7,15]' > $OUT/d/ev_b16_bs8.log 2>&1 &
timeout 300 $E draft_path=/tmp/qs8s/final output_dir=/tmp/ev/ctl exact=false checks.require_identical=false > $OUT/d/ev_ctl.log 2>&1 &
wait; for f in $OUT/d/ev_*.log; do echo "== $f"; tail -c 700 $f; done
tar czf $OUT/d/ev.tgz -C /tmp ev; gzip $OUT/d/ev_*.log
cd $OUT && tar czf d.tgz d && rm -rf d; ls -la $OUT
