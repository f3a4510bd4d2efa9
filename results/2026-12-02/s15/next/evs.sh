# the block-16 drafter's evaluations, all at once: batch 8 over both sets (the acceptance check); each prompt alone, GSM8K one
# process per N, HumanEval two (each with its own AR arm). The exact=false control ran with block 8 on this target (s14). A run
# of one dataset or of N = 1 alone cannot pass the >= 1 accepted check (HumanEval alone accepts < 1; N = 1 drafts one token),
# so those runs check identity only.
d=q16; cd $1; Q=$2; export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
E="python3 eval/run.py experiment=smollm2_exact_gpu target=$Q target.path=/tmp/qwen.gguf target.dequantized_cache=true draft_path=/tmp/$d/final exact_impl=invariant"
run() { name=$1; shift; $E "$@" output_dir=/tmp/ev/$name resume=true > /tmp/ev/$name.log 2>&1; echo "$name rc $? at $SECONDS" >> /tmp/ev/rc.txt; }
N=arms.num_speculative_tokens; ALL="[1,3,7,15]"; OFF=checks.draft_min_accepted=null
run ${d}_bs8 "$N=$ALL" &
run ${d}_b1_gsm8k_1 "$N=[1]" batch_size=1 "data.datasets=[gsm8k]" $OFF &
for n in 3 7 15; do run ${d}_b1_gsm8k_$n "$N=[$n]" batch_size=1 "data.datasets=[gsm8k]" & done
run ${d}_b1_humaneval_a "$N=[1,3]" batch_size=1 "data.datasets=[humaneval]" $OFF &
run ${d}_b1_humaneval_b "$N=[7,15]" batch_size=1 "data.datasets=[humaneval]" $OFF &
wait
