"""The target writes the assistant turns of the training data (spec 3.1).

A drafter imitates its target, so the responses it learns are the target's own greedy
continuations of the training prompts (thinking off unless `data.enable_thinking`). User and
system turns are kept; every assistant turn is regenerated in order, later turns seeing the
target's earlier answers. Generation runs through the engine's autoregressive path
(`speculative_generate(target, None, ...)`), batched by `data.regen_batch_size`.

Output: one JSONL row per conversation, appended and flushed per batch, so a killed run loses
at most one batch and `resume` skips the ids already written:

    {"id", "source", "messages" (user turns + regenerated assistant text),
     "prompt_ids", "response_ids", "finish_reason"    (of the last assistant turn),
     "turns": [{"prompt_ids", "response_ids", "finish_reason"}, ...]   (only when > 1 turn),
     "format_hash", "format" (PromptFormat.to_dict()), "target", "max_new_tokens"}

`response_ids` are the generated tokens, the stop token included when one was emitted.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dflash2.jsonl import append_jsonl, read_jsonl, repair_jsonl
from dflash2.runconfig import HardwareSpec, PromptFormat, TargetSpec, encode_chat, stop_token_ids
from dflash2.training.data import DataSpec, data_format, load_conversations

log = logging.getLogger(__name__)


def _segments(messages: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """Runs of non-assistant messages that each end where an assistant turn is due.

    `[sys, u1, a1, u2, a2]` -> `[[sys, u1], [u2]]`; a run without a user message is dropped.
    """
    runs, cur = [], []
    for m in messages:
        if m["role"] == "assistant":
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append({"role": m["role"], "content": m["content"]})
    if cur:
        runs.append(cur)
    return [r for r in runs if any(m["role"] == "user" for m in r)]


def _existing(out: Path, fmt: PromptFormat, target_name: str) -> set[str]:
    """Ids already in `out`, after checking that they were made the same way.

    A torn last line (a crash mid-write) is dropped with a warning and the file rewritten
    (`dflash2.jsonl.repair_jsonl`) so the run can append cleanly.
    """
    done = set()
    for lineno, row in enumerate(repair_jsonl(out), 1):
        if row.get("format_hash") != fmt.hash:
            raise ValueError(
                f"{out}:{lineno}: written with prompt format {row.get('format')} but this run uses {fmt.to_dict()}; "
                "regenerate into a new file, or set data.enable_thinking / data.system_prompt as before")
        if row.get("target") != target_name:
            raise ValueError(f"{out}:{lineno}: written by target {row.get('target')!r}, this run's target is "
                             f"{target_name!r}; regenerate into a new file")
        done.add(str(row["id"]))
    return done


def _generate(target, prompts: list[list[int]], spec: DataSpec, stops: list[int], progress=None):
    from dflash2 import speculative_generate

    out = speculative_generate(target, None, prompts, max_new_tokens=spec.max_new_tokens, stop_token_ids=stops,
                               progress=progress)
    return [g.tolist() for g in out.generated], list(out.finish_reasons)


def _regenerate_batch(target, tokenizer, convs: list[dict[str, Any]], spec: DataSpec, fmt: PromptFormat,
                      stops: list[int], progress=None) -> list[dict[str, Any]]:
    """Regenerate every assistant turn of `convs`, turn by turn across the batch; `progress` is
    called with the tokens committed as they are (`speculative_generate`'s hook)."""
    segments = [_segments(c["messages"]) for c in convs]
    history: list[list[dict[str, str]]] = [[] for _ in convs]
    turns: list[list[dict[str, Any]]] = [[] for _ in convs]
    for k in range(max(len(s) for s in segments)):
        active = [i for i, s in enumerate(segments) if k < len(s)]
        prompts = []
        for i in active:
            history[i] += segments[i][k]
            prompts.append(encode_chat(tokenizer, history[i], fmt, add_generation_prompt=True))
        responses, reasons = _generate(target, prompts, spec, stops, progress)
        for i, prompt, resp, why in zip(active, prompts, responses, reasons):
            body = resp[:-1] if resp and resp[-1] in stops else resp
            history[i].append({"role": "assistant", "content": tokenizer.decode(body, skip_special_tokens=False)})
            turns[i].append({"prompt_ids": prompt, "response_ids": resp, "finish_reason": why})
    rows = []
    for conv, hist, conv_turns in zip(convs, history, turns):
        last = conv_turns[-1]
        row = {"id": conv["id"], "source": spec.name, "messages": hist, "prompt_ids": last["prompt_ids"],
               "response_ids": last["response_ids"], "finish_reason": last["finish_reason"]}
        if len(conv_turns) > 1:
            row["turns"] = conv_turns
        rows.append(row)
    return rows


def default_target_name(target) -> str:
    cfg = getattr(target, "config", None)
    return str(getattr(cfg, "name_or_path", "") or getattr(cfg, "model_type", "") or type(target).__name__)


def regenerate(target, tokenizer, spec: DataSpec, out_path: str | os.PathLike, *, progress: bool = True,
               target_name: str | None = None) -> Path:
    """Have `target` write the assistant turns of `spec`'s conversations into `out_path`.

    Args:
        target: a `TargetModel` or HF causal LM (greedy, through the engine's AR path).
        tokenizer: its tokenizer (must have a chat template).
        spec: data source, `max_new_tokens`, `regen_batch_size`, `enable_thinking`, `system_prompt`.
        out_path: the JSONL to write; ids already in it are skipped (resume), appending the rest.
        progress: show a tqdm bar over the tokens to generate: it moves with every decoding step
            (rate in tokens/s) and counts conversations written in its postfix. Its total is the
            budget, `max_new_tokens` per assistant turn, so the ETA is an upper bound; a batch's
            rows that stopped early give back their unused budget when the batch is written.
        target_name: recorded in each row and checked on resume (default: the model's name).
    Returns:
        `out_path` as a Path.
    Raises:
        ValueError: no chat template, a file written with another format or target, bad data.
    """
    fmt = data_format(tokenizer, spec)
    if spec.regen_batch_size < 1 or spec.max_new_tokens < 1:
        raise ValueError(f"data.regen_batch_size={spec.regen_batch_size} and data.max_new_tokens="
                         f"{spec.max_new_tokens} must both be >= 1")
    name = target_name or default_target_name(target)
    convs = load_conversations(spec)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _existing(out, fmt, name)
    pending = [c for c in convs if c["id"] not in done]
    stops = stop_token_ids(tokenizer)
    meta = {"format_hash": fmt.hash, "format": fmt.to_dict(), "target": name, "max_new_tokens": spec.max_new_tokens}
    if done:
        log.info("%s: resuming, %d of %d conversations already regenerated", out, len(convs) - len(pending), len(convs))
    bs = spec.regen_batch_size
    budget = [len(_segments(c["messages"])) * spec.max_new_tokens for c in pending]
    written = len(convs) - len(pending)
    with tqdm(total=sum(budget), disable=not progress, desc=f"regenerate {spec.name}", unit="tok",
              unit_scale=True, postfix=f"{written}/{len(convs)} conversations") as bar:
        for start in range(0, len(pending), bs):
            batch = pending[start:start + bs]
            before = bar.n
            rows = _regenerate_batch(target, tokenizer, batch, spec, fmt, stops, progress=bar.update)
            append_jsonl(out, [{**row, **meta} for row in rows])  # fsynced: a crash loses at most this batch
            bar.update(sum(budget[start:start + bs]) - (bar.n - before))   # the budget early stops left unused
            written += len(batch)
            bar.set_postfix_str(f"{written}/{len(convs)} conversations")
    from dflash2.engine.kept import release_decode_state

    release_decode_state(target)  # the engine's kept decoding state (GPU): training needs the memory
    return out


# ------------------------------------------------------------------------------ Hydra schema


@dataclass
class RegenerateConfig:
    """Primary schema of `train/regenerate.py` (`configs/distill/regenerate.yaml`)."""

    target: TargetSpec = field(default_factory=TargetSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    data: DataSpec = field(default_factory=DataSpec)
    output_dir: str = "outputs/regenerate"
    resume: bool = False
    seed: int = 0


def register_regenerate_schema() -> None:
    """Store `RegenerateConfig` as `regenerate_schema` and the shared groups in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from dflash2.runconfig import register_shared_groups

    register_shared_groups()
    ConfigStore.instance().store(name="regenerate_schema", node=RegenerateConfig)


def run_regenerate(cfg) -> Path:
    """Body of `train/regenerate.py`: load the target, regenerate into `output_dir/regenerated.jsonl`.

    Args:
        cfg: a composed `RegenerateConfig` (DictConfig or dataclass).
    Returns:
        the JSONL path.
    """
    import torch
    from omegaconf import OmegaConf

    from dflash2.runconfig import load_target, prepare_output_dir, resolve_device

    if not isinstance(cfg, RegenerateConfig):
        cfg = OmegaConf.to_object(cfg)
    out = prepare_output_dir(cfg.output_dir, cfg.resume, job_name="regenerate")
    device = resolve_device(cfg.hardware)
    torch.manual_seed(cfg.seed)
    target, tokenizer = load_target(cfg.target, device)
    path = regenerate(target, tokenizer, cfg.data, out / "regenerated.jsonl", target_name=cfg.target.name)
    n = stopped = tokens = 0
    for row in read_jsonl(path):
        n += 1
        stopped += row["finish_reason"] == "stop"
        tokens += len(row["response_ids"])
    log.info("%s: %d conversations, %d response tokens (last turns), %d ended with a stop token, %d hit "
             "max_new_tokens=%d", path, n, tokens, stopped, n - stopped, cfg.data.max_new_tokens)
    print(f"regenerated {n} conversations -> {path} ({stopped} stopped, {n - stopped} at max_new_tokens)")
    return path
