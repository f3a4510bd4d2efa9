"""Every field of a checkpoint's config.json is typed and ranged: a bad one raises
`DFlash2ConfigError` naming the field, the value and the fix, whether it is loaded from a
checkpoint directory or built in Python. Property tests: random valid configs load and run
(speculative == AR), random single-field corruptions of them raise `DFlash2ConfigError`."""

from __future__ import annotations

import functools
import json
import math
import re
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash2 import DFlash2Config, DFlash2ConfigError, DFlash2DraftModel, speculative_generate
from tests.conftest import randomize_, tiny_draft_config

# Bounded so the CPU suite stays fast: derandomized (the same examples every run), no deadline
# (a shared 2-core machine), no example database written into the checkout.
PROPERTY = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])


def good_config_json() -> dict:
    return json.loads(json.dumps(tiny_draft_config().to_dict()))  # plain JSON values, as on disk


def load_error(raw: dict, tmp: Path) -> str:
    """Write `raw` as config.json and load it: the DFlash2ConfigError's message."""
    (tmp / "config.json").write_text(json.dumps(raw))
    with pytest.raises(DFlash2ConfigError) as err:
        DFlash2DraftModel.from_pretrained(tmp)
    return str(err.value)


def set_path(raw: dict, path: str, value) -> None:
    *parents, leaf = path.split(".")
    node = raw
    for p in parents:
        node = node[p]
    node[leaf] = value


# ---------------------------------------------------------------- the table, rows 3-4
def test_negative_hidden_size_is_named(tmp_path):
    raw = good_config_json()
    raw["hidden_size"] = -64
    assert load_error(raw, tmp_path) == ("hidden_size: -64 is out of range (need >= 1). "
                                         "Fix: write a positive int: the target's hidden size.")


def test_block_size_as_text_is_named(tmp_path):
    raw = good_config_json()
    raw["dflash_config"]["block_size"] = "sixteen"
    msg = load_error(raw, tmp_path)
    assert msg.startswith("dflash_config.block_size: 'sixteen' is a str, not an int. Fix: write an int >= 2")


def test_unknown_architecture_is_named(tmp_path):
    raw = good_config_json()
    raw["architectures"] = ["LlamaForCausalLM"]
    msg = load_error(raw, tmp_path)
    assert msg.startswith("architectures: ['LlamaForCausalLM'] names no single DFlash draft architecture")
    assert "['DFlash2DraftModel']" in msg and "['DFlashDraftModel']" in msg


# ---------------------------------------------------------------- every field, one by one
CASES = [
    ("architectures", ["DFlash2DraftModel", "DFlashDraftModel"], "names no single DFlash draft"),
    # transformers 5.24 lets the strict dataclass accept a str here, 5.13/5.17 refuse it: either way named
    ("architectures", "DFlash2DraftModel", "names no single DFlash draft|is invalid"),
    ("hidden_size", "64", "is invalid"),
    ("hidden_size", True, "got bool"),
    ("vocab_size", 0, "out of range"),
    ("intermediate_size", -1, "out of range"),
    ("num_hidden_layers", 0, "out of range"),
    ("num_attention_heads", 0, "out of range"),
    ("num_key_value_heads", 3, "does not divide num_attention_heads 4"),
    ("head_dim", 15, "is odd"),
    ("head_dim", 0, "out of range"),
    ("hidden_act", "swishy", "is not a known activation"),
    ("max_position_embeddings", 0, "out of range"),
    ("initializer_range", -0.02, "out of range"),
    ("rms_norm_eps", -1e-6, "out of range"),
    ("rms_norm_eps", "1e-6", "is invalid"),
    ("attention_dropout", 1.0, "out of range"),
    ("attention_bias", "false", "is invalid"),
    ("rope_parameters", {"rope_type": "banana", "rope_theta": 1e4}, "not a RoPE setting"),
    ("rope_parameters.rope_theta", -1.0, "out of range"),
    ("layer_types", ["full_attention"], "for 2 draft layers"),
    ("layer_types", ["full_attention", "chunked_attention"], "for 2 draft layers"),
    ("num_target_layers", 0, "out of range"),
    ("is_causal", "no", "is not a bool"),
    ("dtype", "int8", "not a floating-point dtype"),
    ("dflash_config", [1, 2], "is not a dict"),
    ("dflash_config.block_size", 1, "out of range"),
    ("dflash_config.block_size", 16.0, "is a float, not an int"),
    ("dflash_config.mask_token_id", 300, r"out of range \(need in \[0, 299\]\)"),
    ("dflash_config.mask_token_id", -1, "out of range"),
    ("dflash_config.mask_token_id", "299", "is a str"),
    ("dflash_config.target_layer_ids", [], "is empty or missing"),
    ("dflash_config.target_layer_ids", [0, 4], "out of range for a target with 4 layers"),
    ("dflash_config.target_layer_ids", "0,2", "is not a list of ints"),
    ("dflash_config.target_layer_ids", [0.5], "is not a list of ints"),
    ("dflash_config.conv_kernel_size", 0, "out of range"),
    ("dflash_config.conv_kernel_size", 9, r"out of range \(need in \[1, 8\]\)"),
    ("dflash_config.conv_group_size", 24, "does not divide hidden_size 64"),
    ("dflash_config.conv_group_size", 0, "out of range"),
    ("dflash_config.selector_rank", "8", "is a str"),
    ("dflash_config.selector_top_k", 301, "out of range"),
    ("dflash_config.output_multiplier", 0, "out of range"),
    ("dflash_config.output_multiplier", "0.2", "is not a finite number"),
    ("dflash_config.output_multiplier", math.inf, "is not a finite number"),
    ("dflash_config.final_logit_softcapping", -3.0, "out of range"),
    ("dflash_config.input_embedding_scale", 0.0, "out of range"),
    ("dflash_config.causal", "yes", "is not a bool"),
    ("dflash_config.sample_from_anchor", True, "never proposes the anchor"),
]


@pytest.mark.parametrize("path, value, problem", CASES, ids=[f"{c[0]}={c[1]!r}" for c in CASES])
def test_each_field_error_names_field_value_and_fix(tmp_path, path, value, problem):
    raw = good_config_json()
    set_path(raw, path, value)
    msg = load_error(raw, tmp_path)
    assert msg.startswith(f"{path}: "), msg
    assert re.search(problem, msg), msg
    if not isinstance(value, (list, dict)) and path != "dtype":
        assert repr(value) in msg or str(value) in msg, msg
    assert ". Fix: " in msg


def test_sliding_layers_without_a_window(tmp_path):
    raw = good_config_json()
    raw.update(layer_types=["sliding_attention", "full_attention"], use_sliding_window=False, sliding_window=64)
    msg = load_error(raw, tmp_path)
    assert msg.startswith("sliding_window: is null (use_sliding_window=False clears it) but layers [0]")
    raw.update(use_sliding_window=True, sliding_window=0)
    assert load_error(raw, tmp_path).startswith("sliding_window: 0 is out of range")


def test_python_construction_and_assignment_raise_the_same_error():
    with pytest.raises(DFlash2ConfigError, match=r"^hidden_size: '64' is invalid .*Fix: write a positive int"):
        DFlash2Config(hidden_size="64")
    with pytest.raises(DFlash2ConfigError, match=r"^num_hidden_layers: -1 is out of range"):
        DFlash2Config(num_hidden_layers=-1, layer_types=["full_attention"])  # not transformers' layer_types text
    cfg = tiny_draft_config()
    with pytest.raises(DFlash2ConfigError, match=r"^rms_norm_eps: 'small' is invalid"):
        cfg.rms_norm_eps = "small"


# ---------------------------------------------------------------- property tests
@functools.cache
def target_for(vocab: int, hidden: int, layers: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(vocab * 1000 + hidden + layers)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=256,
                      tie_word_embeddings=False)
    return Qwen3ForCausalLM(cfg).double().eval()


@st.composite
def valid_configs(draw) -> dict:
    """A config.json of a tiny DFlash2 or v1 draft, every field drawn within its range."""
    v2 = draw(st.booleans())
    hidden = draw(st.sampled_from([16, 24, 32]))
    heads = draw(st.sampled_from([1, 2, 4]))
    layers, n_target = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    vocab, block = draw(st.integers(8, 40)), draw(st.integers(2, 6))
    dc = dict(block_size=block, mask_token_id=draw(st.integers(0, vocab - 1)),
              target_layer_ids=draw(st.lists(st.integers(0, n_target - 1), min_size=1, max_size=3, unique=True)))
    if v2:
        dc.update(conv_kernel_size=draw(st.integers(1, block)),
                  conv_group_size=draw(st.sampled_from([g for g in range(1, hidden + 1) if hidden % g == 0])),
                  selector_rank=draw(st.integers(1, 6)), selector_top_k=draw(st.integers(1, min(vocab, 6))))
    optional = dict(output_multiplier=st.floats(0.2, 2.0), final_logit_softcapping=st.sampled_from([0.0, 5.0, 30.0]),
                    input_embedding_scale=st.floats(0.5, 2.0), causal=st.booleans())
    for name, strategy in optional.items():
        if draw(st.booleans()):
            dc[name] = draw(strategy)
    raw = dict(architectures=["DFlash2DraftModel" if v2 else "DFlashDraftModel"], model_type="qwen3",
               hidden_size=hidden, intermediate_size=draw(st.integers(1, 3)) * hidden, num_hidden_layers=layers,
               num_attention_heads=heads,
               num_key_value_heads=draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0])),
               head_dim=draw(st.sampled_from([2, 4, 8])), vocab_size=vocab, num_target_layers=n_target,
               rms_norm_eps=draw(st.floats(1e-6, 1e-3)), max_position_embeddings=256, use_sliding_window=True,
               sliding_window=draw(st.integers(1, 12)), attention_bias=draw(st.booleans()),
               layer_types=draw(st.lists(st.sampled_from(["full_attention", "sliding_attention"]),
                                         min_size=layers, max_size=layers)),
               rope_parameters={"rope_type": "default", "rope_theta": draw(st.floats(100.0, 1e6))},
               dflash_config=dc)
    if draw(st.booleans()):
        raw["is_causal"] = draw(st.booleans())
    return raw


@settings(PROPERTY, max_examples=10)
@given(raw=valid_configs(), seed=st.integers(0, 2**16))
def test_valid_configs_load_and_run(raw, seed):
    cfg = DFlash2Config(**raw)
    cfg.check()
    draft = randomize_(DFlash2DraftModel(cfg), seed=seed, std=0.2).double().eval()
    with tempfile.TemporaryDirectory() as tmp:
        draft.save_pretrained(tmp)
        loaded = DFlash2DraftModel.from_pretrained(tmp)
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), loaded.state_dict().values()))
    target = target_for(raw["vocab_size"], raw["hidden_size"], raw["num_target_layers"])
    prompt = [[(seed + 7 * i) % raw["vocab_size"] for i in range(5)]]
    spec = speculative_generate(target, loaded, prompt, max_new_tokens=7)
    ar = speculative_generate(target, None, prompt, max_new_tokens=7)
    assert spec.sequences[0].tolist() == ar.sequences[0].tolist() and len(spec.generated[0]) == 7


def _bad_values(raw: dict) -> list[tuple[str, object]]:
    """Single-field corruptions that are invalid for this `raw` whatever its other fields."""
    dc, vocab, hidden = raw["dflash_config"], raw["vocab_size"], raw["hidden_size"]
    bad = [("hidden_size", 0), ("hidden_size", -hidden), ("hidden_size", str(hidden)), ("vocab_size", -1),
           ("intermediate_size", 0), ("num_hidden_layers", -1), ("num_attention_heads", 0),
           ("num_key_value_heads", raw["num_attention_heads"] + 1), ("head_dim", 3), ("hidden_act", "gelu_fancy"),
           ("max_position_embeddings", -5), ("rms_norm_eps", 0.0), ("initializer_range", -1.0),
           ("attention_dropout", 1.5), ("rope_parameters.rope_theta", -10.0), ("sliding_window", 0),
           ("layer_types", ["full_attention"] * (raw["num_hidden_layers"] + 1)), ("num_target_layers", 0),
           ("is_causal", "false"), ("dtype", "int8"), ("architectures", ["DFlash3DraftModel"]),
           ("dflash_config.block_size", 1), ("dflash_config.block_size", "16"),
           ("dflash_config.mask_token_id", vocab), ("dflash_config.mask_token_id", -3),
           ("dflash_config.target_layer_ids", []), ("dflash_config.target_layer_ids", [raw["num_target_layers"]]),
           ("dflash_config.output_multiplier", -0.5), ("dflash_config.final_logit_softcapping", -1.0),
           ("dflash_config.input_embedding_scale", 0.0), ("dflash_config.sample_from_anchor", True),
           ("dflash_config.causal", 1)]
    if raw["architectures"] == ["DFlash2DraftModel"]:  # v1 drafts have no conv and no selector
        bad += [("dflash_config.conv_kernel_size", dc["block_size"] + 1), ("dflash_config.conv_kernel_size", 0),
                ("dflash_config.conv_group_size", hidden + 1), ("dflash_config.selector_rank", 0),
                ("dflash_config.selector_top_k", vocab + 1), ("dflash_config.selector_top_k", 2.0)]
    return bad


@settings(PROPERTY, max_examples=40)
@given(raw=valid_configs(), data=st.data())
def test_invalid_configs_raise_config_error(raw, data):
    path, value = data.draw(st.sampled_from(_bad_values(raw)), label="corruption")
    set_path(raw, path, value)
    if path == "sliding_window":
        raw["layer_types"] = ["sliding_attention"] * raw["num_hidden_layers"]
    leaf = path.split(".")[-1]
    with tempfile.TemporaryDirectory() as tmp:
        msg = load_error(raw, Path(tmp))
    assert msg.split(":")[0].endswith(leaf) and ". Fix: " in msg, (path, value, msg)
    with pytest.raises(DFlash2ConfigError):  # the same config built in Python
        DFlash2Config(**raw).check()
