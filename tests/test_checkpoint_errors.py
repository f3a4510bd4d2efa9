"""Bad checkpoints: truncated or corrupted files, wrong dtypes, non-finite values, two
checkpoints in one directory, broken indexes and config.json files. Each error names the file
and what is wrong, and loading returns nothing half-built."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dflash2 import DFlash2ConfigError, DFlash2DraftModel
from dflash2.checkpoint import INDEX_NAME, WEIGHTS_NAME, CheckpointFileError, inspect_checkpoint
from tests.conftest import randomize_, tiny_draft_config


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One good tiny checkpoint (fp32), saved once; tests copy what they need from it."""
    path = tmp_path_factory.mktemp("good")
    model = randomize_(DFlash2DraftModel(tiny_draft_config()), seed=1).eval()
    model.save_pretrained(path)
    return path


def copy_of(saved, tmp_path):
    for f in saved.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    return tmp_path


def state_of(saved) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(saved / WEIGHTS_NAME))


def load_fails(path, error, pattern, *, from_metadata: bool = True):
    """Loading `path` raises `error` matching `pattern`, with a fix; so does inspecting its
    metadata alone (the entry points' check before any weight loads: `inspect_checkpoint`)
    unless `from_metadata=False` (a fault only the tensor data shows)."""
    with pytest.raises(error, match=pattern) as err:
        DFlash2DraftModel.from_pretrained(path)
    assert "Fix:" in str(err.value)
    if from_metadata:
        with pytest.raises(error, match=pattern) as early:
            inspect_checkpoint(path)
        assert "Fix:" in str(early.value)
    else:
        inspect_checkpoint(path)
    return str(err.value)


def test_good_checkpoint_loads(saved):
    assert DFlash2DraftModel.from_pretrained(saved).selector_enabled
    config = inspect_checkpoint(saved)                  # metadata alone: the same checkpoint passes
    assert config.is_dflash2 and config.dflash_block_size == 8


# ---------------------------------------------------------------- the table, row 5
@pytest.mark.parametrize("keep", [0.5, 0.999], ids=["half", "last-byte"])
def test_truncated_file_is_named(saved, tmp_path, keep):
    path = copy_of(saved, tmp_path)
    data = (path / WEIGHTS_NAME).read_bytes()
    (path / WEIGHTS_NAME).write_bytes(data[: int(len(data) * keep)])
    msg = load_fails(path, CheckpointFileError, "model.safetensors: not a readable safetensors file")
    assert str(path / WEIGHTS_NAME) in msg and "truncated or corrupted" in msg and "re-download" in msg


@pytest.mark.parametrize("damage", ["header-length", "header-json", "empty"])
def test_corrupted_header_is_named(saved, tmp_path, damage):
    path = copy_of(saved, tmp_path)
    f = path / WEIGHTS_NAME
    data = bytearray(f.read_bytes())
    if damage == "header-length":
        data[:8] = (len(data) * 4).to_bytes(8, "little")
    elif damage == "header-json":
        data[8:12] = b"\xff\xfe\x00!"
    else:
        data = bytearray()
    f.write_bytes(bytes(data))
    load_fails(path, CheckpointFileError, rf"{f.name}: not a readable safetensors file")


# ---------------------------------------------------------------- dtype and values
def test_integer_tensor_is_refused_with_its_name(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    state = state_of(saved)
    state["fc.weight"] = (state["fc.weight"] * 100).to(torch.int8)
    save_file(state, str(path / WEIGHTS_NAME))
    load_fails(path, CheckpointFileError, r"tensor 'fc.weight' has dtype torch.int8.*floating point")


def test_non_finite_tensor_is_refused_with_its_name(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    state = state_of(saved)
    state["layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(state, str(path / WEIGHTS_NAME))
    load_fails(path, CheckpointFileError, r"tensor 'layers.1.mlp.up_proj.weight' contains NaN or inf",
               from_metadata=False)


def test_integer_dtype_in_config_or_argument_is_refused(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw["dtype"] = "int8"
    (path / "config.json").write_text(json.dumps(raw))
    load_fails(path, DFlash2ConfigError, r"dtype: .*int8.* is not a floating-point dtype")
    with pytest.raises(ValueError, match=r"dtype=torch.int64: .*floating"):
        DFlash2DraftModel.from_pretrained(saved, dtype=torch.int64)


def test_mixed_float_dtypes_load_in_one_dtype(saved, tmp_path):
    """Not an error: a bf16 file with fp32 codebooks loads in the config's dtype."""
    path = copy_of(saved, tmp_path)
    state = {k: v.to(torch.bfloat16) for k, v in state_of(saved).items()}
    state["candidate_selector.successor_codebook"] = state["candidate_selector.successor_codebook"].float()
    save_file(state, str(path / WEIGHTS_NAME))
    model = DFlash2DraftModel.from_pretrained(path)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


# ---------------------------------------------------------------- two checkpoints in one directory
def test_two_unindexed_files_are_two_checkpoints(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    other = randomize_(DFlash2DraftModel(tiny_draft_config()), seed=9).state_dict()
    save_file({k: v.contiguous() for k, v in other.items()}, str(path / "draft-v2.safetensors"))
    msg = load_fails(path, CheckpointFileError, r"holds 2 safetensors files \['draft-v2.safetensors', "
                                                r"'model.safetensors'\] but no model.safetensors.index.json")
    assert "one checkpoint per directory" in msg


def write_shards(path, state: dict[str, torch.Tensor], index_overrides=None):
    """Two shards of `state` plus their index (the layout `save_pretrained` of big models uses)."""
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: state[k].contiguous() for k in keys}, str(path / fname))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    weight_map.update(index_overrides or {})
    (path / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_checkpoint_loads(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / WEIGHTS_NAME).unlink()
    write_shards(path, state_of(saved))
    inspect_checkpoint(path)
    loaded = DFlash2DraftModel.from_pretrained(path).state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state_of(saved).items())


def test_single_file_beside_an_index_is_a_second_checkpoint(saved, tmp_path):
    path = copy_of(saved, tmp_path)  # keeps model.safetensors
    write_shards(path, state_of(saved))
    load_fails(path, CheckpointFileError, r"holds \['model.safetensors'\] besides the shards listed in "
                                          r"model.safetensors.index.json: two checkpoints")


def test_index_and_shards_of_different_checkpoints(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / WEIGHTS_NAME).unlink()
    first = sorted(state_of(saved))[0]  # stored in shard 1; the index claims shard 2
    write_shards(path, state_of(saved), index_overrides={first: "model-00002-of-00002.safetensors"})
    load_fails(path, CheckpointFileError, rf"model-00001-of-00002.safetensors: holds tensor '{first}', which "
                                          r"model.safetensors.index.json places in 'model-00002-of-00002.safetensors'")


def test_index_naming_a_missing_shard_or_tensor(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / WEIGHTS_NAME).unlink()
    write_shards(path, state_of(saved), index_overrides={"extra.weight": "model-00003-of-00003.safetensors"})
    load_fails(path, CheckpointFileError, r"lists shards \['model-00003-of-00003.safetensors'\] that are not in")
    write_shards(path, state_of(saved), index_overrides={"extra.weight": "model-00001-of-00002.safetensors"})
    load_fails(path, CheckpointFileError, r"lists tensors \['extra.weight'\] that no shard holds")


def test_broken_index_is_named(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / WEIGHTS_NAME).unlink()
    write_shards(path, state_of(saved))
    (path / INDEX_NAME).write_text('{"weight_map": ')
    load_fails(path, CheckpointFileError, r"model.safetensors.index.json: not a safetensors index")


def test_tensor_stored_twice_under_alias(saved, tmp_path):
    """The codebook under both spellings (with and without `.weight`) in one file."""
    path = copy_of(saved, tmp_path)
    state = state_of(saved)
    state["candidate_selector.successor_codebook.weight"] = state["candidate_selector.successor_codebook"].clone()
    save_file(state, str(path / WEIGHTS_NAME))
    load_fails(path, CheckpointFileError, r"tensor 'candidate_selector.successor_codebook' is stored twice")


def test_saving_beside_another_checkpoint_is_refused(saved, tmp_path):
    model = DFlash2DraftModel.from_pretrained(saved)
    model.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)  # overwriting its own file is fine
    write_shards(tmp_path, state_of(saved))
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointFileError, match=r"already holds another checkpoint .*empty directory"):
        model.save_pretrained(tmp_path)


# ---------------------------------------------------------------- config.json itself
def test_config_json_that_is_not_json(saved, tmp_path):
    path = copy_of(saved, tmp_path)
    (path / "config.json").write_text('{"architectures": ["DFlash2DraftModel"],')
    load_fails(path, DFlash2ConfigError, r"config.json: not valid JSON")
    (path / "config.json").write_text("[1, 2]")
    load_fails(path, DFlash2ConfigError, r"config.json: holds a list, not a JSON object")


def test_missing_config_json_still_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        DFlash2DraftModel.from_pretrained(tmp_path)
