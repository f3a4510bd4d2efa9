# the evaluations of one drafter (q8 or q16), all at once: batch 8 over both sets, each prompt alone split by set and by N
d=$1; cd $2; export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
E="python3 eval/run.py experiment=smollm2_exact_gpu target=qwen2.5-coder-1.5b target.source=hub target.path=/tmp/qwen_hf draft_path=/tmp/$d/final"
run() { name=$1; shift; $E "$@" output_dir=/tmp/ev/$name resume=true > /tmp/ev/$name.log 2>&1; echo "$name rc $? at $SECONDS" >> /tmp/ev/rc.txt; }
if [ $d = q8 ]; then ALL="[1,3,7]"; A="[1,3]"; B="[7]"; else ALL="[1,3,7,15]"; A="[1,3]"; B="[7,15]"; fi
N=arms.num_speculative_tokens
run ${d}_bs8 "$N=$ALL" &
[ $d = q8 ] && run ctl "$N=$ALL" exact=false checks.require_identical=false &
run ${d}_b1_gsm8k_a "$N=$A" batch_size=1 "data.datasets=[gsm8k]" &
run ${d}_b1_gsm8k_b "$N=$B" batch_size=1 "data.datasets=[gsm8k]" &
run ${d}_b1_humaneval_a "$N=$A" batch_size=1 "data.datasets=[humaneval]" &
run ${d}_b1_humaneval_b "$N=$B" batch_size=1 "data.datasets=[humaneval]" &
wait
