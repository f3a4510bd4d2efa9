"""Training data for drafter distillation (spec 3.1-3.3; DESIGN.md section 4).

Pipeline:

    load_conversations(spec)           prompt sources -> datasets.Dataset {id, messages}; the
                                       evaluation-data guard runs here (contamination.py)
    regenerate(target, tok, spec, out) the target writes every assistant turn (regenerate.py)
    build_training_data(rows, tok, spec)
                                       documents (token ids + loss mask over assistant tokens),
                                       a deterministic held-out split, packing into sequences
    collate(samples)                   pad a batch of packed sequences to [B, S]

Regenerated rows are used through their stored `prompt_ids` + `response_ids`, never by
re-tokenizing decoded text: the draft must learn the target's own token ids. Plain
conversations are rendered with the chat template and the loss mask covers the assistant
spans (content plus the end-of-turn token), found through the tokenizer's character offsets.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from dflash2.jsonl import TornLineWarning, read_jsonl
from dflash2.runconfig import PromptFormat, encode_chat, prompt_format, stop_token_ids
from dflash2.training.contamination import check_dataset_name, check_prompts

log = logging.getLogger(__name__)

# Mixed offline sources: (source, its prompt column) per part, rows interleaved one by one
MIXES = {"gsm8k+stdlib": (("gsm8k", "question"), ("stdlib", "prompt"))}
SOURCES = ("gsm8k", "jsonl", "hub", "stdlib", *MIXES)
ROLES = ("system", "user", "assistant")
# ShareGPT-style conversations ({"from": "human", "value": ...}) map onto chat roles.
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


@dataclass
class DataSpec:
    """Hydra node `data` (group `configs/distill/data/`): where prompts come from and how they
    become training sequences.

    `source`: `gsm8k` (GSM8K as shipped in `dflash2.data`, or the file in `path`; a split the
    package does not ship comes from hub `openai/gsm8k`), `jsonl` (a local JSONL of conversations
    or prompts in `path`), `hub` (a hub dataset name, or a local dataset directory, in `path`),
    `stdlib` (code and instruction prompts built from the Python standard library, offline:
    `dflash2.training.stdlib_prompts`), or `gsm8k+stdlib` (both offline sources, rows taken one
    from each in turn, so that any `limit` is half math and half code; column `prompt`, ids
    `gsm8k/<row>` and `stdlib/...`).
    `regenerated`: a JSONL made by `train/regenerate.py`; None = regenerate into
    `<output_dir>/data/regenerated.jsonl` (resumable) before training.
    """

    name: str = "gsm8k-train"
    source: str = "gsm8k"
    path: str | None = None
    split: str = "train"
    subset: str | None = None        # hub dataset configuration (e.g. `main` for openai/gsm8k)
    prompt_field: str = "question"
    messages_field: str = "messages"
    limit: int | None = None
    shuffle_seed: int = 0
    regenerated: str | None = None
    max_new_tokens: int = 256
    regen_batch_size: int = 8
    enable_thinking: bool = False
    system_prompt: str | None = None
    max_seq_len: int = 1024
    pack: bool = True
    heldout: int = 16


def data_format(tokenizer, spec: DataSpec) -> PromptFormat:
    """The prompt format `spec` asks for (raises when the tokenizer has no chat template)."""
    return prompt_format(tokenizer, enable_thinking=spec.enable_thinking, system_prompt=spec.system_prompt)


# ------------------------------------------------------------------------------ prompt sources


def _load_json(path: Path):
    """`datasets` JSON loader with errors that name the file and line."""
    import datasets

    if not path.is_file():
        raise FileNotFoundError(f"data.path={path} does not exist; point data.path at a JSONL file")
    try:
        return datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as e:  # the JSON builder's errors do not say which line is broken
        # dflash2.jsonl names the bad line: JsonlError before the last line; a bad last line is a
        # TornLineWarning there (a killed write), but a data file is input, so it is an error here.
        with warnings.catch_warnings(record=True) as torn:
            warnings.simplefilter("always", TornLineWarning)
            read_jsonl(path)
        if torn:
            where = str(torn[0].message).split(": skipped", 1)[0]
            raise ValueError(f"{where}: not valid JSON (the last line); fix or delete that line") from e
        raise ValueError(f"{path}: datasets could not load it as JSONL ({type(e).__name__}: {e})") from e


def _load_raw(spec: DataSpec):
    """The source rows as a `datasets.Dataset` (offline first)."""
    import datasets

    if spec.source == "gsm8k":
        check_dataset_name("gsm8k", spec.split)
        if spec.path:
            return _load_json(Path(spec.path))
        from dflash2.data import read_rows

        if spec.split in ("train", "test"):
            return datasets.Dataset.from_list(read_rows(f"gsm8k/{spec.split}"))
        if os.environ.get("HF_HUB_OFFLINE"):
            raise FileNotFoundError(
                f"GSM8K split={spec.split!r}: the package ships train and test only and HF_HUB_OFFLINE is set; "
                "unset HF_HUB_OFFLINE to load hub openai/gsm8k, or set data.path to a local JSONL")
        return datasets.load_dataset("openai/gsm8k", "main", split=spec.split)
    if spec.source == "jsonl":
        if not spec.path:
            raise ValueError("data.source=jsonl needs data.path=<file.jsonl>")
        return _load_json(Path(spec.path))
    if spec.source == "hub":
        if not spec.path:
            raise ValueError("data.source=hub needs data.path=<hub dataset name or local dataset directory>")
        check_dataset_name(spec.path, spec.split)
        try:
            return datasets.load_dataset(spec.path, spec.subset, split=spec.split)
        except Exception as e:
            raise RuntimeError(
                f"data.path={spec.path!r} subset={spec.subset!r} split={spec.split!r} could not be loaded "
                f"({type(e).__name__}: {e}); check the name and split, or that the hub is reachable "
                "(HF_HUB_OFFLINE unset)") from e
    if spec.source == "stdlib":
        from dflash2.training.stdlib_prompts import stdlib_prompts

        return datasets.Dataset.from_list(stdlib_prompts())
    if spec.source in MIXES:
        parts = []
        for source, column in MIXES[spec.source]:
            raw = _load_raw(replace(spec, source=source, path=None))
            parts.append([{"id": _row_id(row, source, i), "prompt": row[column]} for i, row in enumerate(raw)])
        rows = [r for group in itertools.zip_longest(*parts) for r in group if r is not None]
        return datasets.Dataset.from_list(rows)
    raise ValueError(f"data.source={spec.source!r} is unknown; use one of {', '.join(SOURCES)}")


def _normalize_messages(value: Any, row_id: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise ValueError(f"sample {row_id}: messages must be a list of {{role, content}}, got {type(value).__name__}")
    out = []
    for m in value:
        if not isinstance(m, dict):
            raise ValueError(f"sample {row_id}: each message must be an object with role and content")
        role = m.get("role", m.get("from"))
        role = ROLE_ALIASES.get(role, role)
        content = m.get("content", m.get("value"))
        if role not in ROLES:
            raise ValueError(f"sample {row_id}: message role {role!r} is not one of {', '.join(ROLES)}")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ValueError(f"sample {row_id}: message content must be text, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def _row_id(row: dict[str, Any], name: str, index: int) -> str:
    for key in ("id", "question_id", "task_id"):
        if row.get(key) is not None:
            return str(row[key])
    return f"{name}/{index}"


def user_texts(messages: Iterable[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "user"]


def load_conversations(spec: DataSpec):
    """Load `spec`'s prompt source as conversations, refusing evaluation data.

    Rows with a `spec.messages_field` list are conversations; otherwise `spec.prompt_field`
    becomes a single user turn. Conversations without a non-empty user turn are dropped;
    `spec.limit` keeps the first N (source order, so ids are stable across runs).

    Args:
        spec: the data spec.
    Returns:
        `datasets.Dataset` with columns `id` (str) and `messages` (list of {role, content}).
    Raises:
        ValueError: unknown source, missing fields, malformed JSONL (file:line), or nothing left
            after filtering. `ContaminationError` when any prompt matches evaluation data.
    """
    import datasets

    raw = _load_raw(spec)
    cols = set(raw.column_names)
    if spec.messages_field in cols:
        field_name, is_chat = spec.messages_field, True
    elif spec.prompt_field in cols:
        field_name, is_chat = spec.prompt_field, False
    else:
        raise ValueError(
            f"data {spec.name!r}: neither data.messages_field={spec.messages_field!r} nor "
            f"data.prompt_field={spec.prompt_field!r} is a column (columns: {', '.join(sorted(cols))}); "
            "set one of them")
    rows, dropped = [], 0
    for i, row in enumerate(raw):
        rid = _row_id(row, spec.name, i)
        if is_chat:
            msgs = _normalize_messages(row[field_name], rid)
        else:
            text = row[field_name]
            msgs = [{"role": "user", "content": text if isinstance(text, str) else ""}]
        if not any(t.strip() for t in user_texts(msgs)):
            dropped += 1
            continue
        rows.append({"id": rid, "messages": msgs})
        if spec.limit is not None and len(rows) >= spec.limit:
            break
    if spec.limit is not None and spec.limit <= 0:
        rows = []
    if not rows:
        raise ValueError(
            f"data {spec.name!r}: no conversations left after filtering ({len(raw)} rows read, {dropped} without "
            f"a user turn, limit={spec.limit}); check data.path / data.{'messages' if is_chat else 'prompt'}_field "
            "and data.limit")
    if dropped:
        log.warning("data %s: dropped %d rows without a user turn", spec.name, dropped)
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise ValueError(f"data {spec.name!r}: sample id {dup!r} appears more than once; ids must be unique")
    check_prompts(((r["id"], user_texts(r["messages"])) for r in rows), what=f"data {spec.name!r}")
    return datasets.Dataset.from_list(rows)


# ------------------------------------------------------------------------------ documents


@dataclass
class Document:
    """One training document: token ids and the mask of tokens to learn (1 = assistant)."""

    conv_id: str
    input_ids: list[int]
    loss_mask: list[int]


def template_conversation(tokenizer, messages: list[dict[str, str]], fmt: PromptFormat) -> tuple[list[int], list[int]]:
    """Render a whole conversation with the chat template; mask its assistant spans.

    Each assistant message's content (and the end-of-turn token right after it) is located in
    the rendered text, walking the messages in order so that text repeated from an earlier turn
    is never matched; tokens whose first character falls inside a span get mask 1.

    Returns:
        (input_ids, loss_mask), equal lengths; input_ids equal
        `encode_chat(tokenizer, messages, fmt, add_generation_prompt=False)`.
    """
    msgs = list(messages)
    if fmt.system_prompt and (not msgs or msgs[0]["role"] != "system"):
        msgs = [{"role": "system", "content": fmt.system_prompt}] + msgs
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False,
                                         enable_thinking=fmt.enable_thinking)
    ends = [tokenizer.convert_ids_to_tokens(t) for t in stop_token_ids(tokenizer)]
    spans, cursor = [], 0
    for m in msgs:
        content = m["content"].strip()
        if m["role"] == "assistant" and "</think>" in content and content not in text[cursor:]:
            content = content.split("</think>")[-1].strip()  # templates drop reasoning from history turns
        if not content:
            continue  # an empty assistant turn has no content to learn; its span is left out
        pos = text.find(content, cursor)
        if pos < 0:
            if m["role"] == "assistant":
                raise ValueError(
                    "the chat template rewrote an assistant message so its span cannot be located "
                    f"({content[:60]!r}); regenerate the data with train/regenerate.py instead")
            continue
        end = pos + len(content)
        if m["role"] == "assistant":
            # The end-of-turn token is learned too (the draft must predict the stop).
            after = len(text[end:]) - len(text[end:].lstrip())
            for e in ends:
                if text.startswith(e, end + after):
                    end += after + len(e)
                    break
            spans.append((pos, end))
        cursor = end
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as e:
        raise ValueError(f"{type(tokenizer).__name__} gives no character offsets, which the loss masks of plain "
                         "conversations need; use a fast tokenizer or regenerate the data") from e
    ids = list(enc["input_ids"])
    mask = [0] * len(ids)
    si = 0
    for i, (start, stop) in enumerate(enc["offset_mapping"]):
        while si < len(spans) and start >= spans[si][1]:
            si += 1
        if si < len(spans) and spans[si][0] <= start < spans[si][1] and stop > start:
            mask[i] = 1
    return ids, mask


def _last_prompt(tokenizer, messages: list[dict[str, str]], fmt: PromptFormat) -> list[int]:
    """Prompt ids of the last assistant turn (the conversation before it, with generation prompt)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
    return encode_chat(tokenizer, messages[:last], fmt, add_generation_prompt=True)


def _row_turns(row: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    turns = row.get("turns") or [{"prompt_ids": row["prompt_ids"], "response_ids": row["response_ids"]}]
    return [(list(t["prompt_ids"]), list(t["response_ids"])) for t in turns]


def _documents(rows: list[dict[str, Any]], tokenizer, fmt: PromptFormat | None):
    """Per conversation: (its documents, the held-out document, the held-out prompt ids)."""
    out = []
    for row in rows:
        if "prompt_ids" in row:
            # One document per assistant turn, exactly as the target saw and wrote it.
            turns = _row_turns(row)
            docs = [Document(str(row["id"]), p + r, [0] * len(p) + [1] * len(r)) for p, r in turns]
            out.append((docs, docs[-1], turns[-1][0]))
        else:
            ids, mask = template_conversation(tokenizer, row["messages"], fmt)
            doc = Document(str(row["id"]), ids, mask)
            out.append(([doc], doc, _last_prompt(tokenizer, row["messages"], fmt)))
    return out


# ------------------------------------------------------------------------------ packing


def _to_tensors(docs: list[Document]) -> dict[str, torch.Tensor]:
    ids, mask, pos, doc_ids = [], [], [], []
    for j, d in enumerate(docs):
        n = len(d.input_ids)
        ids += d.input_ids
        mask += d.loss_mask
        pos += range(n)
        doc_ids += [j] * n
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return {"input_ids": as_long(ids), "loss_mask": as_long(mask), "position_ids": as_long(pos),
            "doc_ids": as_long(doc_ids)}


def pack_documents(docs: list[Document], max_seq_len: int, pack: bool = True) -> list[dict[str, torch.Tensor]]:
    """Greedy in-order packing: documents stay whole and never straddle two sequences.

    Args:
        docs: documents, each at most `max_seq_len` tokens.
        max_seq_len: tokens per packed sequence (upper bound).
        pack: False puts every document in its own sequence.
    Returns:
        list of dicts with `input_ids`, `loss_mask`, `position_ids` (restart at 0 per document),
        `doc_ids` (0, 1, ... per document inside the sequence), each `[S]` long, S <= max_seq_len.
    """
    seqs, cur, cur_len = [], [], 0
    for d in docs:
        n = len(d.input_ids)
        if cur and (not pack or cur_len + n > max_seq_len):
            seqs.append(_to_tensors(cur))
            cur, cur_len = [], 0
        cur.append(d)
        cur_len += n
    if cur:
        seqs.append(_to_tensors(cur))
    return seqs


@dataclass
class TrainingData:
    """Packed training sequences, held-out conversations and the prompt-format hash."""

    train: list[dict[str, torch.Tensor]]
    heldout: list[dict[str, torch.Tensor]]
    heldout_prompts: list[list[int]]
    format_hash: str
    stats: dict[str, int] = field(default_factory=dict)
    heldout_ids: list[str] = field(default_factory=list)  # conversation ids of `heldout`, in order


def _format_hash(rows: list[dict[str, Any]], tokenizer, spec: DataSpec) -> str:
    regen = ["prompt_ids" in r for r in rows]
    if any(regen) and not all(regen):
        raise ValueError("training data mixes regenerated rows (with prompt_ids) and plain conversations; "
                         "regenerate all of them with train/regenerate.py or use one kind")
    want = data_format(tokenizer, spec)
    if not any(regen):
        return want.hash
    hashes = {}
    for r in rows:
        hashes.setdefault(r.get("format_hash"), r)
    if len(hashes) > 1:
        shown = "; ".join(f"{h} (e.g. {r['id']}: {r.get('format')})" for h, r in list(hashes.items())[:3])
        raise ValueError(f"regenerated data mixes prompt formats: {shown}; regenerate with one format")
    (h, row), = hashes.items()
    if h is None:
        raise ValueError(f"regenerated row {row['id']} has no format_hash; was it written by train/regenerate.py?")
    if h != want.hash:
        raise ValueError(
            f"regenerated data was made with prompt format {row.get('format')} (hash {h}) but data.* asks for "
            f"{want.to_dict()}; set data.enable_thinking / data.system_prompt to match, or regenerate")
    return h


def build_training_data(source: str | Path | Iterable[dict[str, Any]], tokenizer, spec: DataSpec) -> TrainingData:
    """Documents, deterministic held-out split and packing.

    Args:
        source: a regenerated JSONL path, or its rows, or plain conversations ({id, messages},
            e.g. `load_conversations(spec)`).
        tokenizer: the target's tokenizer (needs a chat template).
        spec: `max_seq_len`, `pack`, `heldout`, `shuffle_seed`, `limit` and the prompt format.
    Returns:
        `TrainingData`; `train` sequences hold only non-held-out conversations.
    Raises:
        ValueError: mixed/mismatched format hashes, no chat template, too few conversations.
    """
    rows = read_jsonl(source) if isinstance(source, (str, Path)) else [dict(r) for r in source]
    if spec.limit is not None:
        rows = rows[: max(spec.limit, 0)]
    if not rows:
        raise ValueError(f"training data {str(source) if isinstance(source, (str, Path)) else ''} is empty "
                         f"(limit={spec.limit}); regenerate it or check data.regenerated")
    for r in rows:
        if "id" not in r or ("prompt_ids" not in r and "messages" not in r):
            raise ValueError(f"training row {str(r)[:80]}... needs id and prompt_ids/response_ids or messages")
    fmt_hash = _format_hash(rows, tokenizer, spec)
    check_prompts(((str(r["id"]), user_texts(r.get("messages") or [])) for r in rows), what="training data")
    fmt = data_format(tokenizer, spec)

    rows.sort(key=lambda r: str(r["id"]))  # the split must not depend on file order (resumed runs append)
    if not 0 <= spec.heldout < len(rows):
        raise ValueError(f"data.heldout={spec.heldout} leaves no training conversations out of {len(rows)}; "
                         "lower data.heldout or use more data")
    order = list(range(len(rows)))
    random.Random(spec.shuffle_seed).shuffle(order)
    convs = _documents([rows[i] for i in order], tokenizer, fmt)
    held, train_convs = convs[: spec.heldout], convs[spec.heldout:]

    docs, truncated, dropped = [], 0, 0
    for conv_docs, _, _ in train_convs:
        for d in conv_docs:
            if len(d.input_ids) > spec.max_seq_len:
                truncated += 1
                d = Document(d.conv_id, d.input_ids[: spec.max_seq_len], d.loss_mask[: spec.max_seq_len])
            if sum(d.loss_mask) == 0:
                dropped += 1
                continue
            docs.append(d)
    if not docs:
        raise ValueError(f"no training document has a token to learn within data.max_seq_len={spec.max_seq_len} "
                         f"({dropped} dropped); raise data.max_seq_len")
    if truncated or dropped:
        log.warning("training data: %d documents truncated to %d tokens, %d dropped (no assistant token left)",
                    truncated, spec.max_seq_len, dropped)
    train = pack_documents(docs, spec.max_seq_len, spec.pack)
    heldout = [_to_tensors([doc]) for _, doc, _ in held]
    stats = {"conversations": len(rows), "train_documents": len(docs), "train_sequences": len(train),
             "train_tokens": sum(len(d.input_ids) for d in docs),
             "train_loss_tokens": sum(sum(d.loss_mask) for d in docs),
             "heldout": len(held), "truncated": truncated, "dropped": dropped}
    return TrainingData(train, heldout, [list(p) for _, _, p in held], fmt_hash, stats,
                        [doc.conv_id for _, doc, _ in held])


def collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad packed sequences to the longest: input_ids 0, loss_mask 0, position_ids 0, doc_ids -1.

    Returns:
        dict of `[B, S]` long tensors.
    """
    if not samples:
        raise ValueError("collate needs at least one sample")
    pad = {"input_ids": 0, "loss_mask": 0, "position_ids": 0, "doc_ids": -1}
    length = max(s["input_ids"].numel() for s in samples)
    out = {}
    for key, value in pad.items():
        batch = torch.full((len(samples), length), value, dtype=torch.long)
        for b, s in enumerate(samples):
            batch[b, : s[key].numel()] = s[key]
        out[key] = batch
    return out
