"""Checks the entry points make from configs and checkpoint metadata alone, before any weight is
loaded or any file written (`eval/run.py` and `train/distill.py` run them with their config
checks, so a refusal is one `error:` line, exit status 2, nothing written; see
`dflash2.entrypoint`).

    the draft checkpoint   `config.json`, weight files present, each safetensors header readable and
                           the file as long as it says, tensor names and shapes against the config
                           (`dflash2.checkpoint.inspect_checkpoint`; no tensor data is read)
    draft vs target        layers, hidden size and vocabulary, where the target's shapes are known
                           without loading it (`target_shapes`: a random target's own spec, or a
                           local directory's `config.json`; a GGUF file or a hub id: unknown, and
                           then checked when the target loads)
    arms vs the draft      each N within the draft's block (`block_size - 1`); the positions the
                           longest arm reaches within the target's `max_position_embeddings`; in
                           exact mode with the invariant kernels, the padded width every arm runs
                           at (`dflash2.engine.inputs.exact_width`, as the runner computes it:
                           the block, or an N + 1 above it of an arm without the drafter)
                           within what the row-attention kernel takes

Each check raises `ValueError` (or the checkpoint module's errors, which are `ValueError`s and
`FileNotFoundError`) naming the key, the value and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TargetShapes:
    """What a draft and the arms are checked against; a field is None where it is not known."""

    num_layers: int | None
    hidden_size: int | None
    vocab_size: int | None
    max_position_embeddings: int | None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None


def target_shapes(spec) -> TargetShapes | None:
    """The shapes of the target `spec` names, read without loading it: a `source=random` target's
    own fields, or the `config.json` of a local `source=hub` directory; None otherwise."""
    if spec.source == "random":
        return TargetShapes(spec.num_hidden_layers, spec.hidden_size, spec.vocab_size, spec.max_position_embeddings,
                            spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim)
    if spec.source != "hub" or not spec.path or not (Path(spec.path) / "config.json").is_file():
        return None
    try:
        raw = json.loads((Path(spec.path) / "config.json").read_text())
    except (OSError, ValueError):
        return None   # the loader names a broken config.json itself
    raw = raw.get("text_config", raw) if isinstance(raw, dict) else {}
    heads = raw.get("num_attention_heads")
    head_dim = raw.get("head_dim") or (raw["hidden_size"] // heads if heads and raw.get("hidden_size") else None)
    return TargetShapes(raw.get("num_hidden_layers"), raw.get("hidden_size"), raw.get("vocab_size"),
                        raw.get("max_position_embeddings"), heads, raw.get("num_key_value_heads", heads), head_dim)


def check_draft_fits(config, shapes: TargetShapes | None, what: str, target_name: str) -> None:
    """Raise `ValueError` when the draft `config` (a `DFlash2Config`) cannot run on a target of
    `shapes`: the same rule as `TargetModel.check_compatible`, before the target is loaded."""
    from dflash2.config import DFlash2ConfigError

    if shapes is None:
        return
    try:
        config.check(target_num_layers=shapes.num_layers, target_hidden_size=shapes.hidden_size,
                     target_vocab_size=shapes.vocab_size)
    except DFlash2ConfigError as e:
        raise ValueError(f"{what} does not fit target={target_name} ({shapes.num_layers} layers, hidden "
                         f"{shapes.hidden_size}, vocab {shapes.vocab_size}): {e}") from None


def check_draft_spec_fits(spec, shapes: TargetShapes | None, target_name: str) -> None:
    """Raise `ValueError` for a `draft.*` value that names a target layer or token the target does
    not have (a new draft is built from these and the target's shapes)."""
    if shapes is None:
        return
    if spec.target_layer_ids is not None and shapes.num_layers is not None:
        bad = [i for i in spec.target_layer_ids if i >= shapes.num_layers]
        if bad:
            raise ValueError(f"draft.target_layer_ids={list(spec.target_layer_ids)}: target={target_name} has "
                             f"{shapes.num_layers} layers (0..{shapes.num_layers - 1}), so {bad} do not exist; "
                             "use layer indices below that, or null for the default spacing")
    if spec.mask_token_id is not None and shapes.vocab_size is not None and spec.mask_token_id >= shapes.vocab_size:
        raise ValueError(f"draft.mask_token_id={spec.mask_token_id}: target={target_name} has a vocabulary of "
                         f"{shapes.vocab_size}; use an id below it, or null to pick an unused one")


def checkpoint_config(path: str, key: str):
    """The checked config of the checkpoint directory `path` given as `key` (e.g. `draft_path`),
    from its metadata alone (`inspect_checkpoint`); errors are prefixed with `key=path`."""
    import os

    from dflash2.checkpoint import inspect_checkpoint

    # Read lexically too, as `runconfig.existing_path` does: `${output_dir}/../train/final` passes
    # through an output_dir the run has not created yet.
    where = path if Path(path).is_dir() else os.path.normpath(path)
    try:
        return inspect_checkpoint(where)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{key}={path}: {e}; give a draft checkpoint directory") from None
    except ValueError as e:
        raise ValueError(f"{key}={path}: {e}") from None


def check_eval_arms(cfg: Any) -> None:
    """Every check of an `EvalConfig` against its draft and target that needs no weights (see the
    module docstring). Raises `ValueError` / `FileNotFoundError`."""
    from dflash2.evaluation.arms import enabled

    arms = cfg.arms
    drafters = enabled(arms, lambda k: k.uses_draft)  # the registered arm kinds that run the draft
    needs_draft = bool(drafters)
    shapes = target_shapes(cfg.target)
    ns = sorted({int(n) for k in drafters for n in k.num_speculative_tokens(arms)})
    block = None
    if needs_draft:
        if cfg.draft_path:
            config = checkpoint_config(cfg.draft_path, "draft_path")
            check_draft_fits(config, shapes, f"draft_path={cfg.draft_path}", cfg.target.name)
            block, source = config.dflash_block_size, f"the draft at draft_path={cfg.draft_path}"
        else:
            check_draft_spec_fits(cfg.draft, shapes, cfg.target.name)
            block, source = int(cfg.draft.block_size), f"draft.block_size={cfg.draft.block_size} (a fresh draft)"
        over = [n for n in ns if n > block - 1]
        if over:
            # name the list that holds them: the drafter's, or the adaptive or tree arms' own N values
            key = next((k for k in ("num_speculative_tokens", "adaptive_num_speculative_tokens",
                                    "tree_num_speculative_tokens") if set(over) & {int(n) for n in
                                                                                   getattr(arms, k, None) or []}),
                       "num_speculative_tokens")
            raise ValueError(f"arms.{key}={list(getattr(arms, key))}: {[n for n in over if n in getattr(arms, key)]} "
                             f"exceed the draft's block: {source} has block_size {block}, so N is at most "
                             f"{block - 1}; use values in 1..{block - 1}")
    others = sorted({int(n) for k in enabled(arms, lambda k: not k.uses_draft) for n in k.num_speculative_tokens(arms)})
    longest = max(ns + others, default=0)
    from dflash2.engine.inputs import exact_width

    width = exact_width(block, ns + others) or 0   # as the runner's `exact_width` computes it
    if shapes is None:
        return
    _check_positions(cfg, shapes, width - 1 if _exact_may_run(cfg) else longest)
    if cfg.exact and getattr(cfg, "exact_impl", "auto") == "invariant" and shapes.num_attention_heads:
        from dflash2.engine.inputs import GenerateInputError, resolve_exact
        from dflash2.runconfig import resolve_device

        heads = (shapes.num_attention_heads, shapes.num_key_value_heads or shapes.num_attention_heads,
                 shapes.head_dim or 0)
        try:  # the engine's resolver, at the width the runner will pass it
            resolve_exact(True, "invariant", resolve_device(cfg.hardware), shape=heads, width=width)
        except GenerateInputError as e:
            raise ValueError(f"exact_impl=invariant: every target forward runs {width} tokens wide (the widest "
                             f"arm: block {block}, arms without the drafter up to N {max(others, default='-')}); {e} "
                             "Or run those arms at smaller N (arms.oracle_num_speculative_tokens)") from None


def _exact_may_run(cfg) -> bool:
    """Whether exact mode may pad this run's forwards to its width (`runner.resolve_exact`: on when
    asked, and under auto for a greedy run on CUDA)."""
    if cfg.exact is not None:
        return bool(cfg.exact)
    from dflash2.runconfig import resolve_device

    return float(cfg.temperature) == 0.0 and resolve_device(cfg.hardware).type == "cuda"


def _check_positions(cfg, shapes: TargetShapes, n_spec: int) -> None:
    """The engine's position rule (`dflash2.engine.inputs`) for the shortest prompt (one token):
    its last position, `max_new_tokens + (N - 1)` for the widest arm's N, must lie below the
    target's `max_position_embeddings`."""
    limit = shapes.max_position_embeddings
    if limit is None:
        return
    overhang = n_spec - 1 if (n_spec > 0 and cfg.max_new_tokens >= 2) else 0
    if cfg.max_new_tokens + overhang >= limit:
        block = f" plus the {overhang} positions of the widest arm's last block (N={n_spec})" if overhang else ""
        raise ValueError(f"max_new_tokens={cfg.max_new_tokens}{block} reaches position {cfg.max_new_tokens + overhang} "
                         f"even after a one-token prompt, but target={cfg.target.name} has max_position_embeddings "
                         f"{limit}; use max_new_tokens <= {limit - 1 - overhang} less the prompt's length")
