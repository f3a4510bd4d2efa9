"""DFlash2Config: the fixture loads, defaults, round trip, and every validation error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash2.config import DFlash2Config, DFlash2ConfigError, build_target_layer_ids
from tests.conftest import tiny_draft_config

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "zlab-dflash2"


def fixture_dir() -> Path:
    if not FIXTURE.is_dir():
        pytest.skip("shared/fixtures not beside the checkout")
    return FIXTURE


def test_fixture_config_loads_with_all_fields():
    cfg = DFlash2Config.from_pretrained(str(fixture_dir()))
    cfg.check()
    assert cfg.is_dflash2
    assert (cfg.dflash_block_size, cfg.mask_token_id) == (16, 201818)
    assert cfg.target_layer_ids == [1, 13, 25, 37, 49]
    assert (cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_rank, cfg.selector_top_k) == (2, 16, 256, 16)
    assert cfg.output_multiplier == pytest.approx(0.19611613513818404)
    assert cfg.final_logit_softcapping == 20.0
    assert cfg.input_embedding_scale == 1.0  # absent in the file -> default
    assert cfg.is_causal is False and not any(cfg.layer_is_causal(i) for i in range(5))
    assert [cfg.layer_window(i) for i in range(5)] == [2048] * 5


def test_fixture_round_trip_preserves_dflash_config(tmp_path):
    cfg = DFlash2Config.from_pretrained(str(fixture_dir()))
    cfg.save_pretrained(str(tmp_path))
    saved = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((fixture_dir() / "config.json").read_text())
    assert saved["dflash_config"] == original["dflash_config"]
    assert saved["architectures"] == ["DFlash2DraftModel"]
    for key in ("hidden_size", "layer_types", "sliding_window", "is_causal", "num_target_layers", "vocab_size"):
        assert saved[key] == original[key], key


def test_v1_config_defaults_and_legacy_top_level_block_size(tmp_path):
    raw = tiny_draft_config(v2=False).to_dict()
    raw["block_size"] = 10
    raw["dflash_config"] = {"mask_token_id": 7}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = DFlash2Config.from_pretrained(str(tmp_path))
    assert not cfg.is_dflash2
    assert cfg.dflash_block_size == 10
    assert cfg.target_layer_ids == build_target_layer_ids(4, 2)  # v1 default from num_target_layers
    assert cfg.output_multiplier == 1.0 and cfg.final_logit_softcapping == 0.0
    assert "conv_kernel_size" not in cfg.dflash_config  # v1 files stay v1 files


def test_build_target_layer_ids_matches_spec_examples():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(52, 5) == [1, 13, 25, 37, 49]
    assert build_target_layer_ids(36, 1) == [18]


def test_causality_precedence():
    cfg = tiny_draft_config()
    cfg.layer_types = ["sliding_attention", "full_attention"]
    assert [cfg.layer_is_causal(i) for i in range(2)] == [True, False]  # sliding => causal by default
    cfg.dflash_config["causal"] = False
    assert [cfg.layer_is_causal(i) for i in range(2)] == [False, False]
    cfg.is_causal = True
    assert [cfg.layer_is_causal(i) for i in range(2)] == [True, True]


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(dflash=dict(conv_group_size=24)), "conv_group_size"),
        (dict(dflash=dict(selector_top_k=301)), "selector_top_k"),
        (dict(dflash=dict(block_size=1)), "block_size"),
        (dict(dflash=dict(conv_kernel_size=9)), "conv_kernel_size"),
        (dict(dflash=dict(selector_rank=0)), "selector_rank"),
        (dict(dflash=dict(mask_token_id=300)), "mask_token_id"),
        (dict(dflash=dict(target_layer_ids=[0, 4])), "target_layer_ids"),
        (dict(dflash=dict(output_multiplier=-1.0)), "output_multiplier"),
        (dict(dflash=dict(final_logit_softcapping=-3.0)), "final_logit_softcapping"),
        (dict(dflash=dict(sample_from_anchor=True)), "sample_from_anchor"),
    ],
)
def test_each_validation_error_names_field_and_fix(change, field):
    cfg = tiny_draft_config(**change["dflash"])
    with pytest.raises(DFlash2ConfigError, match=field) as err:
        cfg.check()
    assert "Fix:" in str(err.value)


def test_target_compatibility_errors():
    cfg = tiny_draft_config()
    cfg.check(target_num_layers=4, target_hidden_size=64, target_vocab_size=300)
    with pytest.raises(DFlash2ConfigError, match="target_layer_ids.*2 layers"):
        cfg.check(target_num_layers=2)
    with pytest.raises(DFlash2ConfigError, match="hidden_size"):
        cfg.check(target_hidden_size=128)
    with pytest.raises(DFlash2ConfigError, match="vocab_size"):
        cfg.check(target_vocab_size=301)


def test_v1_skips_conv_and_selector_checks():
    tiny_draft_config(v2=False, conv_group_size=24, selector_top_k=10_000).check()
