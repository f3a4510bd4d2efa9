"""Shared tiny models. Everything is seeded and small enough for a 2-core CPU."""

from __future__ import annotations

import os

import torch  # importing torch alone does not import triton

# Triton picks its interpreter when `@triton.jit` runs, i.e. at import. Without CUDA compiled
# Triton cannot run anyway, so turn the interpreter on before anything (transformers ->
# torch._dynamo) imports triton: the kernel tests then run on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

# Under pytest-xdist (`make test` runs `-n auto`) the workers share the cores: each takes its
# share of torch's intra-op threads instead of every worker starting one per core.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def _interpreter_dot_independent_of_position() -> None:
    """Make the Triton interpreter's fp32 `tl.dot` give each output element bits that do not
    depend on where it sits in the block.

    The interpreter computes `tl.dot` with `numpy.matmul`, and the OpenBLAS under numpy 2.4
    (this machine's Haswell kernels) rounds an fp32 product's element differently depending on
    its column in the block: shifting the columns of a 16 x 32 operand changed the bits in 23 of
    31 shifts. The row-invariance tests move a row to another place in the block (a row alone,
    a query alone), so they would measure the host's BLAS rather than our kernels' plumbing; on
    the GPU each element's reduction order is fixed by the kernel, and the GPU tests check that.
    Here the products are summed in fp64 and rounded once to fp32 (the products of fp32 inputs
    are exact in fp64), which is independent of the position, and as accurate or more."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = interpreter.InterpreterBuilder
    stock = builder.create_dot
    if getattr(stock, "position_independent", False):
        return

    def create_dot(self, a, b, d, *args, **kwargs):
        if a.data.dtype == b.data.dtype == d.data.dtype == np.float32:
            prod = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)).astype(np.float32)
            return interpreter.TensorHandle(prod + d.data, d.dtype.scalar)
        return stock(self, a, b, d, *args, **kwargs)

    create_dot.position_independent = True
    builder.create_dot = create_dot


_interpreter_dot_independent_of_position()

from dflash2.config import DFlash2Config  # noqa: E402


def tiny_draft_config(*, v2: bool = True, hidden: int = 64, layers: int = 2, vocab: int = 300,
                      num_target_layers: int = 4, **dflash) -> DFlash2Config:
    dc = dict(block_size=8, mask_token_id=vocab - 1, target_layer_ids=[0, 2], conv_kernel_size=2,
              conv_group_size=16, selector_rank=8, selector_top_k=4)
    dc.update(dflash)
    return DFlash2Config(
        architectures=["DFlash2DraftModel" if v2 else "DFlashDraftModel"],
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=vocab, num_target_layers=num_target_layers,
        rms_norm_eps=1e-6, max_position_embeddings=4096, dflash_config=dc,
    )


def tiny_qwen3(vocab: int = 300, hidden: int = 64, layers: int = 4, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).eval()


def tiny_llama(vocab: int = 300, hidden: int = 64, layers: int = 4, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.1) -> torch.nn.Module:
    """Every parameter random (including conv and selector), so nothing hides behind identity init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if p.dim() == 1 else 0.0))
    return model


@pytest.fixture
def draft_config():
    return tiny_draft_config()
