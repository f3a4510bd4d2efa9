"""Checkpoint IO: the z-lab tensor contract (fixture header), strict loading, round trips."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dflash2 import DFlash2Config, DFlash2DraftModel
from dflash2.checkpoint import CheckpointMismatchError, expected_tensor_shapes
from tests.conftest import randomize_, tiny_draft_config
from tests.test_config import fixture_dir


def fixture_header() -> dict[str, list[int]]:
    raw = json.loads((fixture_dir() / "safetensors-header.json").read_text())
    return {k: v["shape"] for k, v in raw.items() if k != "__metadata__"}


def test_fixture_config_implies_exactly_the_fixture_tensors():
    cfg = DFlash2Config.from_pretrained(str(fixture_dir()))
    got = {k: list(v) for k, v in expected_tensor_shapes(cfg).items()}
    assert got == fixture_header()


def scaled_config() -> DFlash2Config:
    """The fixture's structure (5 layers, 5 features, K=2, g=16) at small sizes."""
    cfg = DFlash2Config.from_pretrained(str(fixture_dir()))
    small = cfg.to_dict()
    small.update(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                 vocab_size=500, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    small["dflash_config"] = dict(small["dflash_config"], selector_rank=8, mask_token_id=499)
    return DFlash2Config.from_dict(small)


def write_scaled_fixture_checkpoint(path, cfg: DFlash2Config, *, drop=None, reshape=None, rename=None):
    """Safetensors whose names are exactly the fixture header's, shapes scaled to `cfg`."""
    H, inter, V, R = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.selector_rank
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    G = H // cfg.conv_group_size
    scale = {6656: H, 33280: 5 * H, 4096: nh * hd, 1024: nkv * hd, 128: hd, 19968: inter, 1664: 2 * 2 * G,
             256: R, 202048: V, 2: 2}
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in fixture_header().items():
        if name == drop:
            continue
        shape = [scale[d] for d in shape]
        if name == reshape:
            shape[-1] += 1
        tensors[rename.get(name, name) if rename else name] = torch.randn(shape, generator=g).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(path))
    save_file(tensors, str(path / "model.safetensors"))
    return tensors


def test_scaled_fixture_checkpoint_loads_with_strict_names(tmp_path):
    cfg = scaled_config()
    tensors = write_scaled_fixture_checkpoint(tmp_path, cfg)
    model = DFlash2DraftModel.from_pretrained(tmp_path)
    state = model.state_dict()
    assert set(state) == set(tensors)
    assert all(torch.equal(state[k], v) for k, v in tensors.items())
    assert model.dtype == torch.bfloat16 and model.selector_enabled
    # It runs: one block over a short context.
    with torch.no_grad():
        out = model(torch.arange(3 + 4)[None], torch.randn(1, 4, 64, dtype=torch.bfloat16),
                    torch.randn(1, 3, 5 * 64, dtype=torch.bfloat16))
    assert out.shape == (1, 4, 64) and torch.isfinite(out).all()


def test_codebooks_with_weight_suffix_also_load(tmp_path):
    cfg = scaled_config()
    rename = {n: n + ".weight" for n in ("candidate_selector.predecessor_codebook",
                                         "candidate_selector.successor_codebook")}
    tensors = write_scaled_fixture_checkpoint(tmp_path, cfg, rename=rename)
    model = DFlash2DraftModel.from_pretrained(tmp_path)
    assert torch.equal(model.candidate_selector.successor_codebook,
                       tensors["candidate_selector.successor_codebook.weight"])


@pytest.mark.parametrize(
    "kind, name, pattern",
    [
        ("reshape", "layers.2.mlp_conv.kernel_projection.weight",
         "layers.2.mlp_conv.kernel_projection.weight' has shape"),
        ("drop", "layers.4.self_attn.k_norm.weight", "layers.4.self_attn.k_norm.weight' .* is missing"),
        ("rename", "fc.weight", "'fc.bias' .* is in the checkpoint but not"),
    ],
)
def test_mismatch_names_the_first_bad_tensor(tmp_path, kind, name, pattern):
    cfg = scaled_config()
    kwargs = {"reshape": dict(reshape=name), "drop": dict(drop=name), "rename": dict(rename={name: "fc.bias"})}[kind]
    write_scaled_fixture_checkpoint(tmp_path, cfg, **kwargs)
    with pytest.raises(CheckpointMismatchError, match=pattern):
        DFlash2DraftModel.from_pretrained(tmp_path)


def test_v2_tensors_under_a_v1_config_are_refused(tmp_path):
    cfg = scaled_config()
    write_scaled_fixture_checkpoint(tmp_path, cfg)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["architectures"] = ["DFlashDraftModel"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointMismatchError, match="candidate_selector.hidden_projection.weight"):
        DFlash2DraftModel.from_pretrained(tmp_path)


def test_pickle_only_directory_is_refused(tmp_path):
    tiny_draft_config().save_pretrained(str(tmp_path))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(FileNotFoundError, match="pickle"):
        DFlash2DraftModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("v2", [True, False], ids=["dflash2", "v1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip_is_bit_exact(tmp_path, v2, dtype):
    model = randomize_(DFlash2DraftModel(tiny_draft_config(v2=v2)), seed=3).to(dtype).eval()
    model.save_pretrained(tmp_path)
    header = json.loads((tmp_path / "config.json").read_text())
    assert header["architectures"] == ["DFlash2DraftModel" if v2 else "DFlashDraftModel"]
    loaded = DFlash2DraftModel.from_pretrained(tmp_path)
    a, b = model.state_dict(), loaded.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert loaded.selector_enabled == v2
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in b)
    x = (torch.arange(9)[None], torch.randn(1, 4, 64).to(dtype), torch.randn(1, 5, 128).to(dtype))
    with torch.no_grad():
        assert torch.equal(model(*x), loaded(*x))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_saved_files_get_the_umask_mode(tmp_path, umask, mode):
    """safetensors writes through an owner-only temporary file; the saved checkpoint must still be
    readable by whoever the umask lets read the user's files (a serving process, another user)."""
    import os
    import stat

    old = os.umask(umask)
    try:
        DFlash2DraftModel(tiny_draft_config()).save_pretrained(tmp_path / "ckpt")
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "ckpt").iterdir()}
    assert modes == {"config.json": mode, "model.safetensors": mode}
