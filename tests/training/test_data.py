"""Prompt sources, loss masks, packing, held-out split, collate and their bad inputs."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from dflash2.runconfig import TargetSpec, encode_chat, load_tokenizer, prompt_format
from dflash2.training.data import (
    DataSpec,
    build_training_data,
    collate,
    load_conversations,
    template_conversation,
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TargetSpec())  # the real Qwen3 tokenizer and chat template


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of 1s."""
    runs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


CONV = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Say 'yes' if 2 + 2 = 4."},
    {"role": "assistant", "content": "yes"},  # also inside the user turn: must not be matched there
    {"role": "user", "content": "And 3 * 3?"},
    {"role": "assistant", "content": "3 * 3 = 9.\n\nDone."},
]


@pytest.mark.parametrize("system_prompt", [None, "You are terse."])
def test_loss_mask_covers_exactly_the_assistant_tokens(tok, system_prompt):
    fmt = prompt_format(tok, system_prompt=system_prompt)
    msgs = CONV[1:] if system_prompt else CONV
    ids, mask = template_conversation(tok, msgs, fmt)
    assert ids == encode_chat(tok, msgs, fmt, add_generation_prompt=False)
    spans = [tok.decode(ids[a:b]) for a, b in _runs(mask)]
    assert spans == ["yes<|im_end|>", "3 * 3 = 9.\n\nDone.<|im_end|>"]


def _conversations(n: int) -> list[dict]:
    return [{"id": f"c/{i:02d}", "messages": [{"role": "user", "content": f"What is {i} + {i}? " * (1 + i % 4)},
                                               {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]}
            for i in range(n)]


def _split_docs(seq: dict[str, torch.Tensor]) -> list[tuple[list[int], list[int]]]:
    out = []
    for d in seq["doc_ids"].unique().tolist():
        sel = seq["doc_ids"] == d
        pos = seq["position_ids"][sel]
        assert pos.tolist() == list(range(int(sel.sum())))  # positions restart per document
        assert sel.nonzero().flatten().diff().eq(1).all()  # a document is one contiguous run
        out.append((seq["input_ids"][sel].tolist(), seq["loss_mask"][sel].tolist()))
    return out


def test_packing_keeps_documents_whole_and_split_is_disjoint(tok):
    convs = _conversations(20)
    spec = DataSpec(max_seq_len=120, heldout=4, shuffle_seed=3)
    data = build_training_data(convs, tok, spec)
    fmt = prompt_format(tok)
    whole = {c["id"]: template_conversation(tok, c["messages"], fmt) for c in convs}
    by_ids = {tuple(v[0]): k for k, v in whole.items()}
    assert all(s["input_ids"].numel() <= spec.max_seq_len for s in data.train)
    assert len(data.train) < 16  # several documents share a sequence
    packed = [d for s in data.train for d in _split_docs(s)]
    train_ids = [by_ids[tuple(ids)] for ids, _ in packed]  # every packed document is one whole conversation
    assert all(list(whole[cid][1]) == mask for cid, (_, mask) in zip(train_ids, packed))
    assert sorted(train_ids + data.heldout_ids) == sorted(whole)  # disjoint, and nothing lost
    assert len(data.heldout) == len(data.heldout_prompts) == 4
    for cid, seq, prompt in zip(data.heldout_ids, data.heldout, data.heldout_prompts):
        assert seq["input_ids"].tolist() == whole[cid][0]
        msgs = next(c["messages"] for c in convs if c["id"] == cid)
        assert prompt == encode_chat(tok, msgs[:1], fmt)
    assert data.format_hash == fmt.hash

    again = build_training_data(list(reversed(convs)), tok, spec)  # file order does not matter
    assert again.heldout_ids == data.heldout_ids
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(again.train, data.train))
    other = build_training_data(convs, tok, DataSpec(max_seq_len=120, heldout=4, shuffle_seed=4))
    assert other.heldout_ids != data.heldout_ids

    unpacked = build_training_data(convs, tok, DataSpec(max_seq_len=120, heldout=4, shuffle_seed=3, pack=False))
    assert len(unpacked.train) == 16 and all(s["doc_ids"].max() == 0 for s in unpacked.train)


def _regen_rows(tok, fmt_hash: str) -> list[dict]:
    rows = []
    for i in range(5):
        msgs = [{"role": "user", "content": f"Question {i}"}]
        p = encode_chat(tok, msgs, prompt_format(tok))
        # Response ids that re-tokenizing their text would not give back (a word split in two).
        resp = tok.encode("an", add_special_tokens=False) + tok.encode(f"swer{i}", add_special_tokens=False)
        assert resp != tok.encode(tok.decode(resp), add_special_tokens=False)
        resp = resp + [151645]
        rows.append({"id": f"r/{i}", "messages": msgs + [{"role": "assistant", "content": f"answer{i}"}],
                     "prompt_ids": p, "response_ids": resp, "finish_reason": "stop", "format_hash": fmt_hash})
    rows[4]["turns"] = [{"prompt_ids": [1, 2, 3], "response_ids": [4, 5]},
                        {"prompt_ids": rows[4]["prompt_ids"], "response_ids": rows[4]["response_ids"]}]
    return rows


def test_regenerated_rows_use_their_token_ids(tok, tmp_path):
    fmt = prompt_format(tok)
    rows = _regen_rows(tok, fmt.hash)
    path = _write(tmp_path / "regen.jsonl", rows)
    data = build_training_data(path, tok, DataSpec(heldout=1, shuffle_seed=0, max_seq_len=4096))
    docs = [d for s in data.train for d in _split_docs(s)]
    expected = {}
    for r in rows:
        for t in r.get("turns") or [r]:
            ids = t["prompt_ids"] + t["response_ids"]
            expected[tuple(ids)] = [0] * len(t["prompt_ids"]) + [1] * len(t["response_ids"])
    held = next(r for r in rows if r["id"] == data.heldout_ids[0])
    assert data.heldout_prompts == [held["prompt_ids"]]
    for ids, mask in docs:
        assert expected[tuple(ids)] == mask
    n_train_docs = sum(len(r.get("turns") or [r]) for r in rows if r["id"] != held["id"])
    assert len(docs) == n_train_docs


def test_format_hash_mismatch_and_mixture_refused(tok):
    fmt = prompt_format(tok)
    rows = _regen_rows(tok, fmt.hash)
    rows[2]["format_hash"] = "0123456789abcdef"
    with pytest.raises(ValueError, match="mixes prompt formats"):
        build_training_data(rows, tok, DataSpec(heldout=1))
    rows = _regen_rows(tok, fmt.hash)
    with pytest.raises(ValueError, match="enable_thinking"):
        build_training_data(rows, tok, DataSpec(heldout=1, enable_thinking=True))
    with pytest.raises(ValueError, match="mixes regenerated rows"):
        build_training_data(rows + _conversations(2), tok, DataSpec(heldout=1))


def test_collate_pads():
    a = {"input_ids": torch.tensor([5, 6, 7]), "loss_mask": torch.tensor([0, 1, 1]),
         "position_ids": torch.tensor([0, 1, 2]), "doc_ids": torch.tensor([0, 0, 0])}
    b = {"input_ids": torch.tensor([8]), "loss_mask": torch.tensor([1]), "position_ids": torch.tensor([0]),
         "doc_ids": torch.tensor([0])}
    out = collate([a, b])
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert out["doc_ids"].tolist() == [[0, 0, 0], [0, -1, -1]]


def test_sources(tmp_path):
    gsm = load_conversations(DataSpec(limit=3))
    assert gsm["id"] == ["gsm8k-train/0", "gsm8k-train/1", "gsm8k-train/2"]
    assert gsm[0]["messages"][0]["role"] == "user" and gsm[0]["messages"][0]["content"].startswith("Natalia")
    rows = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}], "id": "a"},
            {"conversations": [{"from": "human", "value": "bye"}], "id": "b"}]
    spec = DataSpec(name="sg", source="jsonl", path=_write(tmp_path / "sg.jsonl", rows), messages_field="conversations")
    ds = load_conversations(spec)
    assert ds["id"] == ["a", "b"] and ds[0]["messages"][1] == {"role": "assistant", "content": "hello"}
    hub_dir = tmp_path / "hubds"
    hub_dir.mkdir()
    _write(hub_dir / "train.jsonl", [{"prompt": "Tell me a joke."}, {"prompt": "Name a river."}])
    ds = load_conversations(DataSpec(name="h", source="hub", path=str(hub_dir), prompt_field="prompt"))
    assert ds["id"] == ["h/0", "h/1"] and ds[1]["messages"] == [{"role": "user", "content": "Name a river."}]


# ---------------------------------------------------------------------------- bad input


def test_tokenizer_without_chat_template(tok):
    plain = copy.copy(tok)
    plain.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        build_training_data(_conversations(3), plain, DataSpec(heldout=1))


def test_empty_after_filtering(tmp_path):
    path = _write(tmp_path / "empty.jsonl", [{"prompt": "  "}, {"prompt": ""}])
    with pytest.raises(ValueError, match=r"no conversations left after filtering \(2 rows read, 2 without"):
        load_conversations(DataSpec(name="e", source="jsonl", path=path, prompt_field="prompt"))
    with pytest.raises(ValueError, match="no conversations left"):
        load_conversations(DataSpec(limit=0))


def test_malformed_jsonl_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_conversations(DataSpec(source="jsonl", path=str(path), prompt_field="prompt"))


def test_other_bad_specs(tmp_path, tok):
    with pytest.raises(ValueError, match="data.source='csv' is unknown"):
        load_conversations(DataSpec(source="csv"))
    path = _write(tmp_path / "x.jsonl", [{"text": "a"}])
    with pytest.raises(ValueError, match="columns: text"):
        load_conversations(DataSpec(source="jsonl", path=path))
    with pytest.raises(ValueError, match="data.heldout=5 leaves no training"):
        build_training_data(_conversations(5), tok, DataSpec(heldout=5))
