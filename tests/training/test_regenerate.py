"""Target regeneration: exact greedy token ids, multi-turn, resume, and the Hydra entry point."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from dflash2.runconfig import TargetSpec, encode_chat, load_target, prompt_format, stop_token_ids
from dflash2.training import regenerate as regen_mod
from dflash2.training.data import DataSpec, build_training_data
from dflash2.training.regenerate import regenerate

ROOT = Path(__file__).resolve().parents[2]
NEW = 10  # tokens per response: enough to see the random target wander, cheap on CPU


@pytest.fixture(scope="module")
def target_tok():
    return load_target(TargetSpec())  # tiny random Qwen3, real Qwen3 tokenizer


def _convs_file(tmp_path: Path) -> str:
    rows = [
        {"id": "a", "messages": [{"role": "user", "content": "Name three colours."}]},
        {"id": "b", "messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "What is the capital of France? Explain why it is."},
                                 {"role": "assistant", "content": "(original answer, replaced)"},
                                 {"role": "user", "content": "And of Spain?"},
                                 {"role": "assistant", "content": "(replaced too)"}]},
        {"id": "c", "messages": [{"role": "user", "content": "Hi"}]},
        {"id": "d", "messages": [{"role": "user", "content": "Count to five, slowly please."}]},
        {"id": "e", "messages": [{"role": "user", "content": "Why is the sky blue?"}]},
    ]
    path = tmp_path / "convs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _spec(path: str, **kw) -> DataSpec:
    return DataSpec(name="t", source="jsonl", path=path, max_new_tokens=NEW, regen_batch_size=2, **kw)


@torch.no_grad()
def _greedy(model, prompt: list[int], n: int, stops: list[int]) -> list[int]:
    """Plain argmax loop over full forwards: the oracle the engine's AR path must match."""
    ids = torch.tensor([prompt])
    out = []
    for _ in range(n):
        nxt = int(model(ids, logits_to_keep=1).logits[0, -1].argmax())
        out.append(nxt)
        if nxt in stops:
            break
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def test_rows_hold_the_targets_greedy_ids(target_tok, tmp_path):
    target, tok = target_tok
    out = regenerate(target, tok, _spec(_convs_file(tmp_path)), tmp_path / "r.jsonl", progress=False,
                     target_name="tiny")
    rows = [json.loads(line) for line in open(out)]
    assert [r["id"] for r in rows] == ["a", "b", "c", "d", "e"]
    fmt, stops = prompt_format(tok), stop_token_ids(tok)
    for row in rows:
        assert row["format_hash"] == fmt.hash and row["format"] == fmt.to_dict() and row["target"] == "tiny"
        turns = row.get("turns") or [row]
        msgs = [m for m in row["messages"]]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        assert len(turns) == len(users) and msgs[-1]["role"] == "assistant"
        for turn, ui in zip(turns, users):
            # The prompt is the conversation so far, with the target's own earlier answers.
            assert turn["prompt_ids"] == encode_chat(tok, msgs[: ui + 1], fmt)
            assert turn["response_ids"] == _greedy(target.model, turn["prompt_ids"], NEW, stops)
            body = turn["response_ids"][:-1] if turn["response_ids"][-1] in stops else turn["response_ids"]
            assert msgs[ui + 1]["content"] == tok.decode(body)
            assert turn["finish_reason"] == ("stop" if len(body) < len(turn["response_ids"]) else "length")
    assert len(rows[1]["turns"]) == 2 and "replaced" not in json.dumps(rows[1]["messages"])
    assert rows[1]["prompt_ids"] == rows[1]["turns"][1]["prompt_ids"]

    data = build_training_data(out, tok, DataSpec(heldout=1, max_seq_len=512))
    docs = sum(int(s["doc_ids"].max()) + 1 for s in data.train)
    assert docs == 5 and data.format_hash == fmt.hash  # 4 conversations, one with two turns


def test_resume_after_interruption_gives_the_same_file(target_tok, tmp_path, monkeypatch):
    target, tok = target_tok
    spec = _spec(_convs_file(tmp_path))
    full = regenerate(target, tok, spec, tmp_path / "full.jsonl", progress=False)

    calls = {"n": 0}
    real = regen_mod._generate

    def dying(*args, **kw):  # the process "dies" during the third generate call (second batch, turn 2)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(regen_mod, "_generate", dying)
    part = tmp_path / "part.jsonl"
    with pytest.raises(KeyboardInterrupt):
        regenerate(target, tok, spec, part, progress=False)
    monkeypatch.setattr(regen_mod, "_generate", real)
    assert len(part.read_text().splitlines()) == 2  # the first batch was flushed
    with open(part, "a") as f:
        f.write('{"id": "b", "sour')  # a torn line from a crash mid-write
    regenerate(target, tok, spec, part, progress=False)
    assert part.read_bytes() == full.read_bytes()

    with pytest.raises(ValueError, match="prompt format"):
        regenerate(target, tok, _spec(spec.path, enable_thinking=True), part, progress=False)
    with pytest.raises(ValueError, match="target"):
        regenerate(target, tok, spec, part, progress=False, target_name="another")


def test_progress_moves_with_every_decoding_step(target_tok, tmp_path, monkeypatch):
    """The bar counts tokens as the engine commits them (many updates per batch, not one per
    batch), ends exactly at its total (the budget: max_new_tokens per assistant turn), and names
    the conversations written."""
    target, tok = target_tok
    bars = []

    class Recorder:
        def __init__(self, **kw):
            self.kw, self.n, self.updates, self.postfix = kw, 0, [], []
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, k):
            self.n += k
            self.updates.append(k)

        def set_postfix_str(self, text):
            self.postfix.append(text)

    monkeypatch.setattr(regen_mod, "tqdm", Recorder)
    out = regenerate(target, tok, _spec(_convs_file(tmp_path)), tmp_path / "r.jsonl")
    (bar,) = bars
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    turns = sum(len(r.get("turns", [None])) for r in rows)           # conversation b has two
    assert bar.kw["total"] == bar.n == turns * NEW and bar.kw["unit"] == "tok"
    assert len(bar.updates) > 3 * len(bar.postfix) and len(bar.postfix) == 3   # 5 conversations, batches of 2
    assert bar.postfix[-1] == "5/5 conversations" and bar.kw["postfix"] == "0/5 conversations"


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from dflash2.training.regenerate import register_regenerate_schema

    register_regenerate_schema()
    with initialize_config_dir(config_dir=str(ROOT / "configs" / "distill"), version_base=None):
        return compose("regenerate", overrides=overrides)


def test_hydra_config_composes_and_refuses_a_misspelt_key():
    cfg = _compose(["target=smollm2-135m", "data=jsonl", "data.path=x.jsonl"])
    assert cfg.target.name == "smollm2-135m" and cfg.data.source == "jsonl" and cfg.resume is False
    with pytest.raises(Exception, match="limitt"):
        _compose(["data.limitt=3"])


def test_entry_point_end_to_end(tmp_path, monkeypatch):
    from dflash2.training.regenerate import run_regenerate

    out = tmp_path / "run"
    overrides = ["target=tiny-qwen3", "hardware=cpu", "data=gsm8k-train", "data.limit=2", "data.max_new_tokens=4",
                 f"output_dir={out}"]
    # The script itself, as a user runs it (in-process: a subprocess would pay the imports again).
    monkeypatch.setattr(sys, "argv", [str(ROOT / "train" / "regenerate.py"), *overrides])
    runpy.run_path(sys.argv[0], run_name="__main__")
    path = out / "regenerated.jsonl"
    rows = [json.loads(line) for line in open(path)]
    assert [r["id"] for r in rows] == ["gsm8k-train/0", "gsm8k-train/1"]
    assert all(len(r["response_ids"]) <= 4 and r["target"] == "tiny-qwen3" for r in rows)
    assert (out / ".hydra" / "config.yaml").is_file()  # Hydra's run dir is output_dir

    with pytest.raises(FileExistsError, match="resume=true"):
        run_regenerate(_compose(overrides))
    assert run_regenerate(_compose([*overrides, "data.limit=3", "resume=true"])) == path
    assert [json.loads(line)["id"] for line in open(path)] == ["gsm8k-train/0", "gsm8k-train/1", "gsm8k-train/2"]
