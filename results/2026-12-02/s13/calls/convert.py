"""The assembled GGUF -> a bf16 safetensors directory (the same weights, config, tokenizer and chat
template; checked equal on the CPU: state dict, logits, template, stops), so that every process
loads in seconds instead of dequantizing the GGUF again."""
import os, sys, time, torch
from transformers import AutoTokenizer
from dflash2.target import TargetModel
src, dst = sys.argv[1], sys.argv[2]
t = time.time()
tm = TargetModel.from_pretrained(src, dtype=torch.bfloat16)
tok = AutoTokenizer.from_pretrained(os.path.dirname(src), gguf_file=os.path.basename(src))
m = tm.model
m.hf_quantizer = None; m.is_quantized = False
if hasattr(m.config, "quantization_config"):
    del m.config.quantization_config
m.save_pretrained(dst); tok.save_pretrained(dst)
tm2 = TargetModel.from_pretrained(dst, dtype=torch.bfloat16)
sd1, sd2 = m.state_dict(), tm2.model.state_dict()
assert sorted(sd1) == sorted(sd2) and all(torch.equal(sd1[k], sd2[k]) for k in sd1), "weights differ"
print(f"converted {src} -> {dst} in {time.time() - t:.0f} s; {len(sd1)} tensors equal")
