"""`target.dequantized_cache`: a GGUF target's dequantized copy is the same model and tokenizer,
is written once and reused, is rewritten when the GGUF changes, and is never published when it
differs (dflash2/dequantized.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from dflash2 import dequantized
from dflash2.runconfig import TargetSpec, check_target_spec, load_target, stop_token_ids


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The packaged SmolLM2 GGUF linked into a fresh directory, its plain load and its first
    cached load (which writes the copy)."""
    from dflash2.assets import smollm2_gguf

    try:
        d, name = smollm2_gguf()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    root = tmp_path_factory.mktemp("gguf")
    gguf = root / "smollm2.gguf"
    os.symlink(d / name, gguf)
    spec = dict(name="smollm2", source="gguf", path=str(gguf), tokenizer=None, dtype="bfloat16", architecture="llama")
    plain = load_target(TargetSpec(**spec))
    cached = load_target(TargetSpec(**spec, dequantized_cache=True))
    return gguf, spec, plain, cached


def test_the_copy_is_the_same_model_and_tokenizer(smollm2):
    gguf, _, (target, tok), (target_c, tok_c) = smollm2
    copy = dequantized.copy_dir(gguf, torch.bfloat16)
    assert copy.name == "smollm2.gguf.bfloat16" and (copy / "model.safetensors").is_file()
    a, b = target.model.state_dict(), target_c.model.state_dict()
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert all(v.dtype == torch.bfloat16 for v in b.values())
    messages = [{"role": "user", "content": "What is 12 * 7?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == tok_c.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt")["input_ids"]
    assert torch.equal(ids, tok_c(text, return_tensors="pt")["input_ids"])
    assert stop_token_ids(tok) == stop_token_ids(tok_c)
    with torch.no_grad():
        assert torch.equal(target(ids).logits, target_c(ids).logits)
    marker = json.loads((copy / dequantized.MARKER).read_text())
    assert marker["size"] == os.path.getsize(gguf) and marker["dtype"] == "torch.bfloat16"


def test_a_later_run_loads_the_copy_without_converting(smollm2, monkeypatch):
    gguf, spec, (target, _), _ = smollm2

    def no_conversion(*args):
        raise AssertionError("converted again although the copy is current")

    monkeypatch.setattr(dequantized, "_write", no_conversion)
    again, _ = load_target(TargetSpec(**spec, dequantized_cache=True))
    a, b = target.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_changed_gguf_is_converted_again(smollm2, monkeypatch):
    gguf, _, _, _ = smollm2
    copy = dequantized.copy_dir(gguf, torch.bfloat16)
    marker = copy / dequantized.MARKER
    good = marker.read_text()
    marker.write_text(json.dumps({**json.loads(good), "size": 1}))   # as if the GGUF had changed since
    assert not dequantized.is_current(gguf, torch.bfloat16)
    calls = []

    def rewrite(src, dtype, out):   # stands in for the conversion: the same files, a current marker
        calls.append(out)
        for f in copy.iterdir():
            if f.name != dequantized.MARKER:
                os.link(f, out / f.name)
        (out / dequantized.MARKER).write_text(good)

    monkeypatch.setattr(dequantized, "_write", rewrite)
    assert dequantized.dequantized_copy(gguf, torch.bfloat16) == copy
    assert len(calls) == 1 and calls[0] != copy and not calls[0].exists()   # written aside, then renamed
    assert dequantized.is_current(gguf, torch.bfloat16)
    assert [p.name for p in gguf.parent.iterdir() if p.name.startswith(".")] == []


def test_a_copy_that_differs_is_never_published(smollm2, monkeypatch, tmp_path):
    gguf, _, (target, tok), _ = smollm2
    copy = dequantized.copy_dir(gguf, torch.bfloat16)
    state = dict(target.model.state_dict())
    name = next(k for k in state if k.endswith("norm.weight"))
    state[name] = state[name].clone()
    state[name][0] += 1                                  # one element one step off
    with pytest.raises(dequantized.DequantizedCopyError, match="same tensors"):
        dequantized.verify(copy, torch.bfloat16, state, tok)
    dequantized.verify(copy, torch.bfloat16, dict(target.model.state_dict()), tok)   # the true state passes

    other = tmp_path / "other.gguf"
    os.symlink(os.readlink(gguf), other)

    def differs(src, dtype, out):
        (out / "model.safetensors").write_bytes(b"partial")
        raise dequantized.DequantizedCopyError("the dequantized copy differs")

    monkeypatch.setattr(dequantized, "_write", differs)
    with pytest.raises(dequantized.DequantizedCopyError):
        dequantized.dequantized_copy(other, torch.bfloat16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.gguf", "other.gguf.bfloat16.lock"]


def test_the_cache_is_refused_for_a_target_without_a_gguf():
    check_target_spec(TargetSpec(source="gguf", tokenizer=None, dequantized_cache=True))
    with pytest.raises(ValueError, match="dequantized_cache=true: only a source=gguf target"):
        check_target_spec(TargetSpec(source="hub", path="some/dir", dequantized_cache=True))
