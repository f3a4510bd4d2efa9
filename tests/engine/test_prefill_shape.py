"""`dflash2.engine.prefill.prefill_shape`: the batched prefill's shape (the graph path's key) is a
function of the row count and the padded length alone, in normal and invariant exact mode, so
every call of an evaluation's prompt class replays one graph (the warm-up pays its capture)."""

from __future__ import annotations

import pytest

from dflash2.engine import prefill as prefill_mod
from dflash2.engine.prefill import PrefillShape, prefill_group_rows, prefill_length, prefill_shape


@pytest.mark.parametrize("invariant", [False, True])
def test_prompts_of_one_class_share_a_shape(invariant):
    kw = dict(max_len=1024, bucket=64, invariant=invariant, tile=16)
    first = prefill_shape([5, 17, 9, 30], **kw)
    assert first == prefill_shape([40, 3, 61, 12], **kw)       # other lengths, the same 64-token bucket
    assert first != prefill_shape([40, 3, 65, 12], **kw)       # the longest past the bucket
    assert first != prefill_shape([40, 3, 61], **kw)           # another row count
    assert first.rows == 4 and first.length == 64
    assert hash(first) == hash(prefill_shape([40, 3, 61, 12], **kw))


def test_normal_mode_groups_rows_by_count_only(monkeypatch):
    monkeypatch.setattr(prefill_mod, "PREFILL_ROWS", 3)
    shape = prefill_shape([500] * 7, max_len=1024, bucket=64)
    assert shape == PrefillShape(rows=7, length=512, group_rows=3)  # no token budget in normal mode
    assert shape.groups == ((0, 3, 512), (3, 3, 512), (6, 1, 512))


def test_invariant_mode_groups_rows_within_the_token_budget(monkeypatch):
    monkeypatch.setattr(prefill_mod, "PREFILL_TOKENS", 1024)
    shape = prefill_shape([100, 300, 20, 7, 250], max_len=2048, bucket=64, invariant=True, tile=8)
    assert shape.groups == ((0, 3, 320), (3, 2, 320))        # 1024 // 320 = 3 rows a group, all at 320
    assert shape.invariant and shape.tile == 8
    assert prefill_group_rows(4096, invariant=True) == 1      # over the budget: one row a forward
    assert prefill_group_rows(4096, invariant=False) == prefill_mod.PREFILL_ROWS
    assert prefill_group_rows(1, invariant=True) == prefill_mod.PREFILL_ROWS


def test_the_padded_length_stays_within_the_state():
    assert prefill_length(61, max_len=1024, bucket=64) == 64
    assert prefill_length(61, max_len=62, bucket=64) == 62     # clipped to the state's slots
    assert prefill_length(61, max_len=1024, bucket=0) == 61    # no bucket: the longest prompt
    assert prefill_shape([61, 2], max_len=62, bucket=64).length == 62
    with pytest.raises(ValueError, match="at least one prompt"):
        prefill_shape([], max_len=64, bucket=64)
