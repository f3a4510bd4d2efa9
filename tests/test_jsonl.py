"""The one JSONL rule: torn last line skipped when reading, dropped and rewritten on resume,
corruption before the last line refused, non-finite floats as null."""

import json
import math

import pytest

from dflash2.jsonl import (JsonlError, TornLineWarning, append_jsonl, read_jsonl, repair_jsonl,
                           rewrite_jsonl)


def test_append_then_read_round_trips_and_writes_nan_as_null(tmp_path):
    p = tmp_path / "r.jsonl"
    append_jsonl(p, [{"a": 1}, {"b": math.nan, "c": [math.inf, 2.0]}])
    append_jsonl(p, [{"d": "x"}])
    assert read_jsonl(p) == [{"a": 1}, {"b": None, "c": [None, 2.0]}, {"d": "x"}]
    assert "NaN" not in p.read_text() and '"nan"' not in p.read_text()


def test_torn_last_line_is_skipped_when_reading_and_the_file_is_left_alone(tmp_path):
    p = tmp_path / "r.jsonl"
    append_jsonl(p, [{"a": 1}, {"a": 2}])
    p.write_text(p.read_text() + '{"a": 3, "b"')
    before = p.read_text()
    with pytest.warns(TornLineWarning, match=":3: skipped"):
        assert read_jsonl(p) == [{"a": 1}, {"a": 2}]
    assert p.read_text() == before


def test_repair_drops_the_torn_tail_so_the_next_append_is_whole(tmp_path):
    p = tmp_path / "r.jsonl"
    append_jsonl(p, [{"a": 1}])
    p.write_text(p.read_text() + '{"a": 2')
    with pytest.warns(TornLineWarning, match="dropped"):
        assert repair_jsonl(p) == [{"a": 1}]
    append_jsonl(p, [{"a": 3}])
    assert [json.loads(line) for line in p.read_text().splitlines()] == [{"a": 1}, {"a": 3}]
    assert not (tmp_path / "r.jsonl.tmp").exists()


def test_repair_adds_a_missing_final_newline_to_a_whole_last_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}')
    assert repair_jsonl(p) == [{"a": 1}, {"a": 2}]
    append_jsonl(p, [{"a": 3}])
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_a_bad_line_before_the_last_is_corruption_not_a_tear(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(JsonlError, match="r.jsonl:2"):
        read_jsonl(p)
    with pytest.raises(JsonlError, match="r.jsonl:2"):
        repair_jsonl(p)


def test_a_line_that_is_json_but_not_an_object_counts_as_bad(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('[1, 2]\n{"a": 1}\n')
    with pytest.raises(JsonlError, match=":1:"):
        read_jsonl(p)


def test_rewrite_replaces_atomically_and_repair_of_a_missing_file_is_empty(tmp_path):
    p = tmp_path / "r.jsonl"
    assert repair_jsonl(p) == []
    rewrite_jsonl(p, [{"x": 1}])
    rewrite_jsonl(p, [{"x": 2}])
    assert read_jsonl(p) == [{"x": 2}]
