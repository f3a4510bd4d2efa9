"""transformers drift: the target forward passes the cache under whichever keyword the
installed transformers declares (`cache` from 5.24, `past_key_values` before), so no
deprecation warning comes from our calls on any supported version. Run this file under each
version of the declared range (README, "Dependencies and supported versions")."""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings

import pytest
import torch
import transformers
from transformers.utils import logging as hf_logging

from dflash2 import DFlash2DraftModel, TargetModel, speculative_generate
from dflash2.engine.cache import StaticTargetCache, static_attention
from dflash2.target import cache_keyword
from tests.conftest import randomize_, tiny_draft_config, tiny_llama, tiny_qwen3

DEPRECATION = (FutureWarning, DeprecationWarning)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def deprecations():
    """Collect deprecation warnings and transformers' logged warnings raised inside the block.
    transformers logs some deprecations once per process (`warning_once`, an lru_cache), so
    that cache is cleared first: an earlier test cannot have used up the message."""
    hf_logging.warning_once.cache_clear()
    handler, logger = _Records(), hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    found: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        logger.removeHandler(handler)
    found += [str(w.message) for w in caught if issubclass(w.category, DEPRECATION)]
    found += [m for m in handler.messages if "deprecat" in m.lower()]


@pytest.mark.parametrize("factory", [tiny_qwen3, tiny_llama], ids=["qwen3", "llama"])
def test_cache_keyword_is_the_one_forward_declares(factory):
    model = factory()
    declared = inspect.signature(type(model).forward).parameters
    assert cache_keyword(model) == ("cache" if "cache" in declared else "past_key_values")
    assert cache_keyword(model) in declared
    assert cache_keyword(torch.nn.Linear(2, 2)) == "past_key_values"  # no cache argument at all: the old name


@pytest.mark.parametrize("factory", [tiny_qwen3, tiny_llama], ids=["qwen3", "llama"])
def test_target_forward_with_a_cache_warns_nothing(factory):
    model = factory().double()
    target = TargetModel(model, layer_ids=[0, 2])
    ids = torch.randint(0, 300, (2, 5), generator=torch.Generator().manual_seed(0))
    cache = StaticTargetCache(model.config, 2, 16, torch.float64, "cpu")
    pos = torch.arange(5)[None].expand(2, 5)
    with deprecations() as found, torch.no_grad(), static_attention(model):
        cache.prepare(pos, kv_len=5)
        out = target(ids, position_ids=pos, past_key_values=cache)
        plain = target(ids)
    assert found == [], f"transformers {transformers.__version__}: {found}"
    assert out.past_key_values is cache and plain.past_key_values is None
    with torch.no_grad():
        ref = model(ids)
    assert torch.allclose(out.logits, ref.logits) and torch.equal(plain.logits, ref.logits)


def test_generation_warns_nothing():
    """A whole speculative run (prefill, draft, verify, rollback) through stock transformers."""
    model = tiny_qwen3().double()
    draft = randomize_(DFlash2DraftModel(tiny_draft_config()), seed=5, std=0.05).double().eval()
    with deprecations() as found:
        out = speculative_generate(model, draft, [[3, 17, 42, 8]], max_new_tokens=6, num_speculative_tokens=3)
    assert found == [], f"transformers {transformers.__version__}: {found}"
    assert len(out.generated[0]) == 6


def test_the_old_keyword_is_what_warns_on_new_versions():
    """Negative control: where transformers renamed the keyword, passing the old one does warn,
    so `deprecations()` would catch a regression to a hard-coded `past_key_values`."""
    model = tiny_qwen3()
    if cache_keyword(model) != "cache":
        pytest.skip(f"transformers {transformers.__version__} still takes past_key_values without a warning")
    with deprecations() as found, torch.no_grad():
        model(torch.tensor([[1, 2]]), past_key_values=None, use_cache=False)
    assert any("past_key_values" in m for m in found)
