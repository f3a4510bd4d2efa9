"""Sharded evaluation: item assignment, the shard merge (dedup, canonical order, torn lines), and
real 2-process gloo runs (`accelerate launch --multi_gpu`) whose merged records equal the
1-process run's at T = 0 and T = 1 (batch_size=1, and batch_size=2 in the engine's exact mode),
including a 2-process run killed mid-way and resumed on 1 process."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2.engine import speculative_generate
from dflash2.evaluation.analysis.records import RECORDS
from dflash2.evaluation.running.run import run_eval
from dflash2.evaluation.running.runner import EvalRunner
from dflash2.evaluation.running.sharding import (Shard, compare_runs, existing_records, merge_records, merge_run_dir,
                                         shard_file, shard_of)
from dflash2.jsonl import TornLineWarning
from tests.evaluation.synthetic import record
from tests.evaluation.test_eval_configs import _compose

ROOT = Path(__file__).resolve().parents[2]
# 3 items (1 per dataset; MT-Bench: 2 turns) x 3 arms (ar, dflash2@N=3, oracle@N=3): rank 0 gets the
# GSM8K and MT-Bench items, rank 1 the HumanEval one.
BASE = ["experiment=tiny_cpu", "data.limit=1", "max_new_tokens=8", "stats.n_resamples=50", "arms.selector_off=false"]
HAS_EXACT = "exact" in inspect.signature(speculative_generate).parameters


def _rec(arm, sid, v=None, **fields):
    return record(arm, sid, run_id=v, **fields)


def test_items_go_to_rank_i_mod_world_and_mt_bench_turns_stay_together():
    assert [shard_of(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="world"):
        shard_of(0, 0)
    cfg = _compose(["experiment=tiny_cpu", "output_dir=/tmp/unused", "data.limit=3"])
    runner = object.__new__(EvalRunner)  # _samples needs only cfg and shard: no model
    runner.cfg = cfg
    for world in (1, 2, 4):
        per_rank = []
        for rank in range(world):
            runner.shard = Shard(rank, world)
            first, second = runner._samples()
            per_rank.append([it.sample_id(t) for it, t in first + second])
            # Turn 2 of an item lands where its turn 1 is (it needs the AR arm's turn-1 answer).
            assert {it.item_id for it, _ in second} <= {it.item_id for it, _ in first}
        flat = [s for ids in per_rank for s in ids]
        assert len(flat) == len(set(flat))
        assert sorted(flat) == sorted(runner.sample_order())
        if world > 1:
            assert all(per_rank), f"a rank got no samples with world={world}"
    runner.shard = Shard(1, 2)
    first, _ = runner._samples()
    every, _ = runner._samples(all_ranks=True)
    assert [it.sample_id(1) for it, _ in first] == [it.sample_id(1) for it, _ in every[1::2]]


def test_merge_dedups_orders_canonically_and_drops_torn_shard_lines(tmp_path):
    order, arms = ["g/0", "g/1", "m/81/turn1", "m/81/turn2"], ["ar", "spec@3"]
    old = [_rec("ar", "g/0", v="old"), _rec("spec@3", "g/0", v="old")]  # a resumed run's merged file
    (tmp_path / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in old))
    r0 = [_rec("spec@3", "m/81/turn2", v="0"), _rec("ar", "m/81/turn1", v="0"), _rec("ar", "g/0", v="dup")]
    r1 = [_rec("spec@3", "g/1", v="1"), _rec("ar", "g/1", v="1")]
    shard_file(tmp_path, 0).parent.mkdir()
    shard_file(tmp_path, 0).write_text("".join(json.dumps(r) + "\n" for r in r0))
    shard_file(tmp_path, 1).write_text("".join(json.dumps(r) + "\n" for r in r1) + '{"arm": "ar", "sample_')
    (tmp_path / "shards" / "records.rankX.jsonl").write_text("not a shard file\n")
    with pytest.warns(TornLineWarning):
        assert len(existing_records(tmp_path, repair=False)) == 7  # torn line ignored, file untouched
    assert shard_file(tmp_path, 1).read_text().endswith("sample_")
    with pytest.warns(TornLineWarning):
        merged = merge_run_dir(tmp_path, order, arms)
    keys = [(r.arm, r.sample_id) for r in merged]
    assert keys == [("ar", "g/0"), ("spec@3", "g/0"), ("ar", "g/1"), ("spec@3", "g/1"), ("ar", "m/81/turn1"),
                    ("spec@3", "m/81/turn2")]
    assert merged[0].run_id == "dup"  # the last written wins a duplicate (records.dedupe)
    assert shard_file(tmp_path, 1).read_text().endswith("}\n")  # the torn line was cut
    on_disk = [json.loads(line) for line in (tmp_path / RECORDS).read_text().splitlines()]
    assert on_disk == [r.to_json() for r in merged] and not (tmp_path / (RECORDS + ".tmp")).exists()
    # Samples or arms the current config does not know sort last instead of failing.
    extra = merge_records(merged + [_rec("oracle@3", "g/0"), _rec("ar", "zz/9")], order, arms)
    assert [(r.arm, r.sample_id) for r in extra] == keys[:2] + [("oracle@3", "g/0")] + keys[2:] + [("ar", "zz/9")]


def _launch_cmd(out: Path, *overrides: str) -> list[str]:
    """`accelerate launch` of eval/run.py on 2 processes: `--multi_gpu` starts them through
    torchrun; on CPU they join a gloo group. `-m`: the overrides may form a Hydra grid."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            str(ROOT / "eval" / "run.py"), "-m", *BASE, f"output_dir={out}", *overrides]


def _launch_two(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_SILENT": "true"}
    proc = subprocess.run(_launch_cmd(out, *overrides), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def existing_records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run_one(out: Path, *overrides: str) -> Path:
    cfg = _compose([*BASE, f"output_dir={out}", *overrides])
    return run_eval(cfg, out, job_name="eval")


def _check_sharded_dir(two: Path, one: Path) -> None:
    cmp = compare_runs(one, two)
    assert cmp["equal"], json.dumps(cmp, indent=1)
    assert cmp["ranks_a"] == [] and cmp["ranks_b"] == [0, 1]  # both processes really ran
    assert sorted(p.name for p in (two / "shards").iterdir()) == ["records.rank0.jsonl", "records.rank1.jsonl"]
    assert {p.name for p in two.iterdir()} >= {RECORDS, "summary.json", "report.html", "report.md", "run.json"}
    recs = [json.loads(line) for line in (two / RECORDS).read_text().splitlines()]
    assert all(r["world_size"] == 2 for r in recs)
    shards = [{(r["arm"], r["sample_id"]) for r in existing_records_of(shard_file(two, k))} for k in (0, 1)]
    assert not shards[0] & shards[1] and len(shards[0]) + len(shards[1]) == len(recs)  # no item ran twice
    rank_of = {r["sample_id"]: r["rank"] for r in recs}
    assert rank_of["mt_bench/81/turn2"] == rank_of["mt_bench/81/turn1"]
    one_ids = json.loads((one / "run.json").read_text())["run_id"]
    assert json.loads((two / "run.json").read_text())["run_id"] == one_ids  # identity ignores the world size
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s1["arms"] == s2["arms"] and s1["n_samples"] == s2["n_samples"]


@pytest.fixture(scope="module")
def two_batch1(tmp_path_factory):
    out = tmp_path_factory.mktemp("two")
    proc = _launch_two(out, "temperature=0,1")  # one launch, one grid point per temperature
    return out, proc


@pytest.fixture(scope="module")
def one_batch1(tmp_path_factory):
    """The 1-process runs (in this process, through the same `run_eval`), made once each."""
    runs: dict[float, Path] = {}

    def get(temperature: float) -> Path:
        if temperature not in runs:
            runs[temperature] = _run_one(tmp_path_factory.mktemp("one"), f"temperature={temperature}")
        return runs[temperature]

    return get


@pytest.mark.parametrize("point, temperature", [(0, 0.0), (1, 1.0)])
def test_two_processes_equal_one(two_batch1, one_batch1, point, temperature):
    two, proc = two_batch1
    one = one_batch1(temperature)
    _check_sharded_dir(two / str(point), one)
    assert proc.stdout.count("records: ") == 2  # only rank 0 reports, once per grid point


def test_two_process_sweep_into_an_earlier_run_is_refused_and_writes_nothing(two_batch1):
    """Every process of the launch sees the earlier sweep's files (older than the launcher) and
    refuses in one line before Hydra writes anything."""
    two, _ = two_batch1

    def snapshot() -> dict[str, float]:
        return {str(p.relative_to(two)): p.stat().st_mtime for p in two.rglob("*")}

    before = snapshot()
    cmd = _launch_cmd(two, "temperature=0,1")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_SILENT": "true"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "error: output_dir=" in proc.stderr and "is not empty" in proc.stderr
    assert snapshot() == before


@pytest.mark.skipif(not HAS_EXACT, reason="the engine has no exact mode yet")
def test_two_process_resume_under_a_changed_config_is_refused_by_every_process(two_batch1):
    """Rank 0 finds the changed identity; every rank refuses with its one line (none is left
    waiting for rank 0), and the run's files stay as they were."""
    two, _ = two_batch1

    def results() -> dict[str, float]:
        return {str(p.relative_to(two)): p.stat().st_mtime for p in two.rglob("*")
                if p.name.endswith((".jsonl", "run.json", "summary.json"))}

    before = results()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "WANDB_SILENT": "true"}
    proc = subprocess.run(_launch_cmd(two, "temperature=0,1", "resume=true", "seed=7"), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 2 and all("made with another config" in ln and "seed: 0 -> 7" in ln for ln in lines), \
        proc.stderr[-3000:]
    assert results() == before


def test_two_processes_equal_one_in_exact_mode_with_batches(tmp_path):
    two = tmp_path / "two"
    _launch_two(two, "temperature=0,1", "exact=true", "batch_size=2")
    for point, t in ((0, 0.0), (1, 1.0)):
        one = _run_one(tmp_path / f"one{point}", f"temperature={t}", "exact=true", "batch_size=2")
        _check_sharded_dir(two / str(point), one)


def test_killed_two_process_run_resumes_on_one(two_batch1, one_batch1, tmp_path):
    import shutil

    two = tmp_path / "two"
    shutil.copytree(two_batch1[0] / "0", two)
    for name in (RECORDS, "summary.json", "report.html", "report.md"):  # killed before the merge
        (two / name).unlink()
    lines = shard_file(two, 0).read_text().splitlines(keepends=True)
    assert len(lines) == 9  # rank 0: GSM8K + MT-Bench turns 1 and 2, 3 arms each
    shard_file(two, 0).write_text("".join(lines[:4]) + lines[4][:20])  # rank 0 died mid-write
    kept = [json.loads(line) for line in lines[:4] + shard_file(two, 1).read_text().splitlines()]
    cfg = _compose([*BASE, f"output_dir={two}", "temperature=0.0", "resume=true"])
    run_eval(cfg, two, job_name="eval")
    recs = [json.loads(line) for line in (two / RECORDS).read_text().splitlines()]
    by_key = {(r["arm"], r["sample_id"]): r for r in recs}
    assert len(by_key) == len(recs) == 12  # 4 samples x 3 arms, none twice
    for r in kept:  # finished records were kept, not redone
        assert by_key[(r["arm"], r["sample_id"])] == r
    assert sum(r["rank"] is None for r in recs) == 12 - len(kept)  # the rest ran on the 1 process
    assert compare_runs(one_batch1(0.0), two)["equal"]


def test_compare_runs_reports_differences_missing_and_duplicates(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    base = [_rec("ar", "g/0", tokens=[1, 2], accepted=[0, 0], steps=2, correct=True, finish_reason="stop", wall_s=1.0),
            _rec("spec@3", "g/0", tokens=[1, 2], accepted=[1], arm_kind="spec", num_speculative_tokens=3,
                 correct=True, finish_reason="stop", wall_s=0.5)]
    (a / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in base))
    same = [dict(r, rank=i % 2, world_size=2, wall_s=9.0) for i, r in enumerate(base)]
    (b / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in same))
    ok = compare_runs(a, b)
    assert ok["equal"] and ok["n_equal"] == 2 and ok["ranks_b"] == [0, 1] and ok["wall_s_a"] == 1.5
    bad = [dict(same[0], tokens=[1, 3]), same[1], same[1], _rec("ar", "g/1")]
    (b / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in bad))
    out = compare_runs(a, b)
    assert not out["equal"] and out["differing"] == [{"key": ["ar", "g/0"], "fields": ["tokens"]}]
    assert out["duplicates_b"] == 1 and out["only_in_b"] == [["ar", "g/1"]]
    with pytest.raises(FileNotFoundError, match="records.jsonl"):
        compare_runs(a, tmp_path / "nothing")
