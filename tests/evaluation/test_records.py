"""The evaluation record (`dflash2.evaluation.analysis.records`): one list of fields, refused unknown or
missing ones, JSONL round trip with the one torn-line rule, the one dedupe rule, and the record
fields every consumer indexes being fields of `Record`."""

from __future__ import annotations

import json
import math

import pytest

from dflash2.evaluation.analysis.records import (FIELDS, LATER_FIELDS, REQUIRED, Record, append_records, dedupe,
                                                 read_records, read_run_records, record_key)
from dflash2.jsonl import JsonlError, TornLineWarning
from tests.evaluation.synthetic import record, synthetic_records


def test_round_trip_fills_optional_fields_and_refuses_unknown_or_missing_ones():
    row = record("dflash2@N=3", "gsm8k/0001", arm_kind="spec", num_speculative_tokens=3, accepted=[3, 0],
                 steps=2, tokens=[5, 6, 7, 8, 9], correct=True)
    r = Record.from_json(row)
    # every field present, unset ones None; the verify fields only when set (archived runs round-trip)
    assert r.to_json() == {**dict.fromkeys(f for f in FIELDS if f not in LATER_FIELDS), **row}
    verified = {**row, "verify_policy": "chain", "verify_lengths": [3, 3], "verify_rows": [4, 4]}
    assert Record.from_json(verified).to_json() == {**dict.fromkeys(f for f in FIELDS if f != "tree_budget"),
                                                    **verified}
    assert Record.from_json(r.to_json()) == r
    with pytest.raises(dataclasses_frozen_error()):
        r.arm = "other"
    with pytest.raises(ValueError, match=r"unknown fields \['acceptance'\]"):
        Record.from_json({**row, "acceptance": 1.0})
    for key in REQUIRED:
        with pytest.raises(ValueError, match=rf"lacks the required fields \['{key}'\]"):
            Record.from_json({k: v for k, v in row.items() if k != key})
    with pytest.raises(ValueError, match="outside 0..num_speculative_tokens=3"):
        Record.from_json({**row, "accepted": [4, 0]})
    with pytest.raises(ValueError, match="arm_kind 'dflash2'"):
        Record.from_json({**row, "arm_kind": "dflash2"})
    with pytest.raises(ValueError, match="must be lists"):
        Record.from_json({**row, "accepted": None})


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_append_and_read_use_the_one_torn_line_rule(tmp_path):
    path = tmp_path / "records.jsonl"
    rows = [record("ar", f"s/{i}", logprob_mean=float("nan") if i == 1 else -1.0) for i in range(3)]
    append_records(path, rows[:2])
    append_records(path, [Record.from_json(rows[2])])
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[1])["logprob_mean"] is None  # NaN as null, never "nan"
    with open(path, "a") as fh:
        fh.write('{"arm": "ar", "sample_id": "s/3", "tok')  # a write killed midway
    with pytest.warns(TornLineWarning, match="skipped"):
        assert [r.sample_id for r in read_records(path)] == ["s/0", "s/1", "s/2"]
    assert path.read_text().endswith("tok")  # reading never changes the file
    with pytest.warns(TornLineWarning, match="dropped"):
        assert len(read_records(path, repair=True)) == 3
    assert path.read_text().endswith("}\n")  # appending on resume continues on a clean line
    assert read_records(tmp_path / "missing.jsonl", repair=True) == []
    with pytest.raises(FileNotFoundError, match="eval/run.py"):
        read_records(tmp_path / "missing.jsonl")
    path.write_text(lines[0] + "\n{broken\n" + lines[2] + "\n")
    with pytest.raises(JsonlError, match=r"records.jsonl:2"):
        read_records(path)
    with pytest.raises(ValueError, match="unknown fields"):
        append_records(path, [{**rows[0], "extra": 1}])
    assert path.read_text().count("\n") == 3  # a refused record writes nothing


def test_dedupe_keeps_the_last_written_at_the_first_position(tmp_path):
    a0, b0, a1 = record("ar", "a", run_id="old"), record("ar", "b"), record("ar", "a", run_id="new")
    hot = record("ar", "a", temperature=1.0)  # another temperature is another record
    kept = dedupe([a0, b0, a1, hot])
    assert [(r["sample_id"], r.get("run_id"), r["temperature"]) for r in kept] == [("a", "new", 0.0), ("b", None, 0.0),
                                                                                ("a", None, 1.0)]
    assert record_key(a1) == ("ar", 0.0, "a")
    append_records(tmp_path / "records.jsonl", [a0, b0, a1])
    assert [r.run_id for r in read_run_records(tmp_path)] == ["new", None]
    (tmp_path / "records.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no records"):
        read_run_records(tmp_path)


def test_consumers_need_only_the_required_fields():
    """stats, the cost model and the W&B table read optional fields as absent-or-None: records
    that carry only `REQUIRED` give the same tau and speedup as the full ones."""
    from dflash2.evaluation.analysis.cost import for_report
    from dflash2.evaluation.analysis.stats import summarize
    from dflash2.evaluation.analysis.wandb_log import RECORD_COLUMNS, _record_rows

    full = synthetic_records(n_per_dataset=3, ns=(2, 4))
    bare = [{k: r[k] for k in REQUIRED} for r in full]
    s_full, s_bare = summarize(full, n_resamples=50), summarize(bare, n_resamples=50)
    for arm in s_full["arms"]:
        for key in ("tau_pooled", "speedup", "per_position_acceptance"):
            assert s_bare["per_arm"][arm]["overall"][key] == s_full["per_arm"][arm]["overall"][key]
    assert "predictions" in for_report(bare)[0]
    rows = _record_rows(bare)
    assert len(rows) == len(bare) and all(len(row) == len(RECORD_COLUMNS) for row in rows)


def test_synthetic_records_are_valid_records():
    recs = synthetic_records(n_per_dataset=2, ns=(3,))
    assert all(Record.from_json(r).steps == len(r["accepted"]) for r in recs)
    assert not math.isnan(sum(r["wall_s"] for r in recs))


def _imports(path) -> set[str]:
    """Every `dflash2...` module `path` imports (at any depth: deferred imports count too)."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dflash2"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dflash2")}
    return out


def test_evaluation_layers_read_top_down():
    """running -> analysis -> arms, never back (inside running: run -> runner -> sharding; inside
    analysis: report above stats and cost, which are above verify and records, and formatting
    below every report); the engine never imports evaluation (its
    acceptance statistics are the ones evaluation uses)."""
    from pathlib import Path

    import dflash2

    pkg = Path(dflash2.__file__).parent
    below = {f"analysis/{p.name}": ("running",) for p in (pkg / "evaluation" / "analysis").glob("*.py")}
    below.update({f"arms/{p.name}": ("running", "analysis") for p in (pkg / "evaluation" / "arms").glob("*.py")})
    tables = ("analysis.stats", "analysis.cost", "analysis.report")  # what reads the records, not what they read
    below.update({"analysis/records.py": ("running", *tables), "analysis/verify.py": ("running", *tables),
                  "analysis/formatting.py": ("running", *tables, "analysis.compare"),
                  "running/sharding.py": ("running.runner", "running.run"), "running/runner.py": ("running.run",),
                  "analysis/stats.py": ("running", "analysis.report"),
                  "analysis/cost.py": ("running", "analysis.report")})
    for name, forbidden in below.items():
        got = _imports(pkg / "evaluation" / name)
        bad = [m for m in got for f in forbidden
               if m == f"dflash2.evaluation.{f}" or m.startswith(f"dflash2.evaluation.{f}.")]
        assert not bad, f"evaluation/{name} imports {bad} (an upward arrow)"
    for path in (pkg / "engine" / "stats.py", pkg / "engine" / "generate.py"):
        assert not [m for m in _imports(path) if m.startswith("dflash2.evaluation")], path
    assert not (pkg / "engine" / "cost.py").exists()  # the cost model is evaluation's


def test_archived_records_round_trip_byte_for_byte(tmp_path):
    """A record file of an archived run (`results/qwen05b_ablation/eval.tgz`) reads as `Record`s and
    writes back to the same bytes, so archived runs still load, and rebuild, with typed records."""
    import tarfile
    from pathlib import Path

    from dflash2.evaluation.analysis.records import rewrite_records

    archive = Path(__file__).resolve().parents[2] / "results" / "qwen05b_ablation" / "eval.tgz"
    with tarfile.open(archive) as tar:
        original = tar.extractfile("eval/v1_T0/records.jsonl").read()
    path = tmp_path / "records.jsonl"
    path.write_bytes(original)
    recs = read_records(path)
    assert len(recs) == original.count(b"\n") == 1648 and all(isinstance(r, Record) for r in recs)
    assert {r.arm_kind for r in recs} == {"ar", "spec"} and sum(r.exec_result is not None for r in recs) == 328
    rewrite_records(tmp_path / "again.jsonl", recs)
    assert (tmp_path / "again.jsonl").read_bytes() == original
    append_records(tmp_path / "appended.jsonl", recs)
    assert (tmp_path / "appended.jsonl").read_bytes() == original
