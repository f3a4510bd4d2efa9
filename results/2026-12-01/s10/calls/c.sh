# call C: what a user gets (SmolLM2 bf16 with HF + compile; 8B batch 8 with HF + compile), exact cost at 256 tokens
set -x; source .session/env.sh
mkdir -p $OUT/c
timeout 230 python3 -m benchmarks.throughput --target smollm2-135m --dtype bfloat16 --draft-path /tmp/qs/final --batch 1,8 --n 3,7 --limit 32 --linear-impl triton --profile --budget-s 220 --out $OUT/c/tp_smollm2.md --json $OUT/c/tp_smollm2.json > $OUT/c/tp_smollm2.log 2>&1; echo "tp135 rc $?"; cat $OUT/c/tp_smollm2.md | head -60
timeout 200 python3 -m benchmarks.engine --batch 1,8 --context 512 --n 7,15 --new-tokens 256 --compile-level none --linear-impl triton --arms ours --exact-impl invariant --budget-s 190 --out $OUT/c/exact_cost.md --json $OUT/c/exact_cost.json > $OUT/c/exact_cost.log 2>&1; echo "exact rc $?"; head -40 $OUT/c/exact_cost.md
timeout 150 python3 -m benchmarks.engine --shape smollm2-135m --batch 1,8 --context 512 --n 3,7 --new-tokens 256 --compile-level none --linear-impl triton --arms ours --exact-impl invariant --budget-s 140 --out $OUT/c/exact_cost_135m.md --json $OUT/c/exact_cost_135m.json > $OUT/c/exact_cost_135m.log 2>&1; echo "exact135 rc $?"; head -40 $OUT/c/exact_cost_135m.md
cd $OUT && tar czf c.tgz c && rm -rf c; ls -la $OUT
