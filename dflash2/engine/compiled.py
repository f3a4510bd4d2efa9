"""Regional `torch.compile` of the target's (and the draft's) small-kernel modules.

Captured in a CUDA graph, a forward still runs every small kernel of the stock modules (an
RMSNorm alone is six: cast, square, mean, rsqrt, two multiplies), about seventy per decoder
layer. At batch 1 on the H200 those kernels are where the step spends the time above its
GEMM floor, and the norms' mean reductions get slower per row as the verify block widens
(`docs/PERFORMANCE.md`, step profile). `compile_modules` hands sub-modules to `torch.compile`
in place (`nn.Module.compile`, the public API): Inductor fuses each elementwise chain into one
kernel, while the modules, their weights and their forward code stay the stock ones (the
transformers classes for the target; the draft's own classes, which reuse transformers' norm
and MLP).

Two levels:
- `"light"`: every norm (`*norm` sub-modules: the layer norms, attention's q/k norms, the
  draft's `hidden_norm` and final norm) and every `mlp`. Nothing layer-specific is read there,
  so one compile per shape class serves every layer of every model: seconds.
- `"full"`: additionally each decoder layer's attention module (q/k norms, RoPE and the cache
  write fused around the projections; the attention call itself stays eager, see
  `dflash2.engine.cache`). Attention reads its `layer_idx` to find its cache layer, so dynamo
  specializes it per layer: one compile per layer and shape class, about two minutes per class
  at 36 layers on the H200 host. The recompile limit is raised to cover them (dynamo would
  otherwise run the later layers uncompiled). The draft is always compiled `"light"`. At either
  level the limit covers the light frames' entries too (`LIGHT_RECOMPILE_LIMIT`).

`dynamic=True`: batch, block width and K/V length are symbolic, so a new N, batch or K/V bucket
reuses compiled code instead of recompiling (a size of 1 is still its own class). Decoder
layers themselves are not compiled: the target's feature hooks sit on them
(`dflash2.target.TargetModel`). `speculative_generate` runs the prefill with compiled code
switched off (`torch.compiler.set_stance("force_eager")`: a prompt-length shape class would
cost a compile for one forward) and compiles at its first decoding step, which runs eagerly,
never inside a CUDA-graph capture.

Compiled kernels give the same results as the stock ones up to floating-point rounding (a fused
reduction sums in another order), so greedy output can differ from an uncompiled run at bf16
near-ties, as the graph path's K/V buckets do; losslessness (speculative == AR of the same
engine) is unaffected. Inductor compiles with `emulate_precision_casts` (`INDUCTOR_OPTIONS`): a
fused chain rounds its intermediates where the eager ops would, so its bits do not depend on
which ops a compiled graph fused.

Exact mode with the invariant kernels compiles at `"light"` (the default on CUDA;
`dflash2.engine.inputs.resolve_compile`): the norms' means and every linear go through the
invariant operators (`dflash2::row_mean`, `dflash2::small_m_linear`: dynamo traces the function
modes around the step and emits them, Inductor calls them whole), so what Inductor generates
there is elementwise (casts, squares, rsqrt, SiLU, products), one result per element from that
element's inputs whatever the row count or block width. A frame that passed its recompile limit
would run its stock eager code instead, with other roundings; exact mode therefore makes that an
error (`strict_recompiles`). `"full"` and exact mode `"rows"` stay uncompiled in exact mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from dflash2.target import TargetModel

COMPILE_LEVELS = ("light", "full")
COMPILED_FLAG = "_dflash2_compiled"
LIGHT_RECOMPILE_LIMIT = 64  # entries per compiled frame (see compile_modules)
# Inductor options of every compile (module docstring): round as the eager ops do.
INDUCTOR_OPTIONS = {"emulate_precision_casts": True}


def _light_parts(root: nn.Module) -> list[nn.Module]:
    """The norms and MLPs under `root` (outermost match only, so an MLP's insides are not listed
    twice), except those carrying forward hooks (the target's final norm: its feature hook)."""
    parts: list[nn.Module] = []
    seen: set[int] = set()  # a module registered twice (TargetModel.decoder_layers) is visited once

    def walk(module: nn.Module) -> None:
        for name, child in module.named_children():
            if id(child) in seen:
                continue
            seen.add(id(child))
            if name.endswith("norm") or name == "mlp":
                if not (child._forward_hooks or child._forward_pre_hooks):
                    parts.append(child)
            else:
                walk(child)

    walk(root)
    return parts


def compile_modules(model: nn.Module, layers, level: str = "light", *, backend: str = "inductor",
                    dynamic: bool = True) -> int:
    """Compile the `level` parts of `model` in place (idempotent per model).

    Args:
        model: the module tree (a `TargetModel` or a draft model); it (a TargetModel's HF model)
            is marked as compiled.
        layers: its decoder layers (`"full"` compiles each one's attention, `self_attn`).
        level: `"light"` or `"full"` (module docstring).
        backend: the `torch.compile` backend (`"inductor"`; CPU tests use `"eager"`).
        dynamic: compile with symbolic shapes.
    Returns:
        How many modules this call compiled (0 when `model` was compiled before at this level, with
        whichever backend that call used).
    """
    if level not in COMPILE_LEVELS:
        raise ValueError(f"compile level {level!r}: use one of {COMPILE_LEVELS}")
    # The mark sits on the HF model itself: `speculative_generate` wraps a plain HF model in a new
    # TargetModel per call, and compiling its modules again would start their compiles over.
    owner = model.model if isinstance(model, TargetModel) else model
    done = getattr(owner, COMPILED_FLAG, None)
    if done is not None:  # (level, backend) of the first call; a later call keeps that backend
        if done[0] != level:
            raise ValueError(f"{type(model).__name__} was compiled at level {done[0]!r}, not {level!r}; build a "
                             "fresh model to change the compile level")
        return 0
    parts = _light_parts(model)
    config = torch._dynamo.config
    # A norm's or MLP's forward is one frame for every layer and model of the process; it gets an
    # entry per input rank, size-1 specialization (batch 1, a one-token block) and function-mode
    # stack (normal, exact), which passes dynamo's default limit of 8 within one benchmark run
    # (the frame would then run uncompiled for the rest of the process).
    config.recompile_limit = max(config.recompile_limit, LIGHT_RECOMPILE_LIMIT)
    if level == "full":
        attention = [layer.self_attn for layer in layers]
        parts += attention
        # One compile per layer and shape class; transformers' attention forwards share one decorator
        # frame across model classes, so every compiled model of the process counts against one limit.
        config.recompile_limit = max(config.recompile_limit, 16 * len(attention))
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 64 * len(attention))
    options = dict(INDUCTOR_OPTIONS) if backend == "inductor" else None
    for part in parts:
        part.compile(backend=backend, dynamic=dynamic, options=options)
    setattr(owner, COMPILED_FLAG, (level, backend))
    return len(parts)


def is_compiled(*models) -> bool:
    """Whether `compile_modules` compiled any of `models` (TargetModels, HF models, drafts, None)."""
    for model in models:
        owner = model.model if isinstance(model, TargetModel) else model
        if getattr(owner, COMPILED_FLAG, None) is not None:
            return True
    return False


@contextlib.contextmanager
def eager_forward(enabled: bool = True) -> Iterator[None]:
    """Inside the block, compiled modules run their original (uncompiled) code."""
    if not enabled:
        yield
        return
    with torch.compiler.set_stance("force_eager"):
        yield


def strict_recompiles() -> None:
    """Make a compiled frame that reaches its recompile limit raise instead of running its
    original code (dynamo's `fail_on_recompile_limit_hit`, process-wide from the first exact-mode
    call with a compile level on): in exact mode that eager code would round otherwise than the
    compiled code the other calls ran, and their bits would silently part."""
    torch._dynamo.config.fail_on_recompile_limit_hit = True
