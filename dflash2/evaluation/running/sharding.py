"""Sharded evaluation: one process per GPU, one merged record set and one report.

    accelerate launch --num_processes 2 eval/run.py experiment=smollm2_gpu output_dir=DIR ...

Prompts are sharded by *item* (an MT-Bench question's turn 2 needs the AR arm's turn-1 answer,
so both turns stay on one process): item i of the runner's deterministic item order goes to rank
`i % world`. Each process loads the target on `cuda:<local rank>` (gloo on CPU), runs its own
warmup and its own interleaved timed arms (speedups are paired within a process), and appends
its records to `DIR/shards/records.rank<r>.jsonl` with the usual crash/resume rules (torn lines
dropped, finished (arm, sample) pairs skipped, run identity checked by rank 0). After all ranks
finish, rank 0 merges every shard file (and any earlier `records.jsonl`) into one
`DIR/records.jsonl`, one record per (arm, sample) (`records.dedupe`) in a canonical order (sample
order, then arm order), and writes the summary, the report and W&B once (`run.run_eval`). Records of a sharded run carry
`rank` and `world_size`.

A sample's seed depends on (seed, sample_id) only and the run identity not on the process count,
so a run killed under 2 processes resumes under 1 or 4 and the merged records equal a 1-process
run's (bitwise at T = 0 in the engine's exact mode; at T > 0 the same per-sample draws; with
`batch_size > 1` batch composition differs between process counts, so use `exact=true`, which
makes each row independent of its neighbours). One process (`python eval/run.py ...`) behaves
as before: no `shards/`, no extra fields.

Public: `Shard`, `init_shard`, `shard_of`, `shard_file`, `shard_files`, `existing_records`,
`merge_records`, `merge_run_dir`, `compare_runs`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash2.evaluation.analysis.records import RECORDS, Record, as_records, dedupe, read_records, rewrite_records

if TYPE_CHECKING:  # torch loads in init_shard: comparing and merging record files needs none of it
    import torch

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"
# Fields on which a sharded run must equal the 1-process run (wall times, ranks legitimately differ).
COMPARE_FIELDS = ("tokens", "accepted", "correct", "finish_reason")


@dataclass
class Shard:
    """This process's place in the run.

    Attributes:
        rank: process index (0 = the main process, which merges and reports).
        world: number of processes.
        device: the device this process evaluates on (`cuda:<local rank>` with several GPUs).
        state: the `accelerate.PartialState` (None in unit tests).
    """

    rank: int = 0
    world: int = 1
    device: torch.device | None = None
    state: Any = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wait(self) -> None:
        """Barrier over all processes (no-op with one)."""
        if self.world > 1:
            self.state.wait_for_everyone()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every process (any picklable object)."""
        if self.world == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        box = [obj]
        broadcast_object_list(box, from_process=0)
        return box[0]


def init_shard(hardware) -> Shard:
    """Rank, world size and device from `accelerate` (`accelerate launch` / torchrun env).

    One process: the device of `hardware` exactly as before (`resolve_device`). Several: CPU
    processes join a gloo group; GPU processes a NCCL group, each on `cuda:<local rank>`.

    Args:
        hardware: the run's `HardwareSpec` (`device`, `num_threads`).
    Returns:
        the `Shard` of this process.
    """
    import torch
    from accelerate import PartialState

    from dflash2.runconfig import resolve_device

    device = resolve_device(hardware)
    state = PartialState(cpu=device.type == "cpu")
    world, rank = int(state.num_processes), int(state.process_index)
    if world == 1:
        return Shard(0, 1, device, state)
    if device.type == "cuda":
        if hardware.device not in ("auto", "cuda"):
            log.warning("hardware.device=%s ignored with %d processes: rank %d uses %s", hardware.device, world,
                        rank, state.device)
        device = torch.device(state.device)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return Shard(rank, world, device, state)


def shard_of(index: int, world: int) -> int:
    """The rank that evaluates item `index` (0-based, in the runner's item order)."""
    if world < 1 or index < 0:
        raise ValueError(f"shard_of(index={index}, world={world}): need index >= 0 and world >= 1")
    return index % world


def shard_file(out_dir: str | Path, rank: int) -> Path:
    """`DIR/shards/records.rank<r>.jsonl`: the file rank `r` appends its records to."""
    return Path(out_dir) / SHARDS_DIR / f"records.rank{int(rank)}.jsonl"


def shard_files(out_dir: str | Path) -> list[Path]:
    """Every shard file in `out_dir`, by rank (also those of an earlier run with more processes)."""
    d = Path(out_dir) / SHARDS_DIR
    if not d.is_dir():
        return []
    files = [p for p in d.glob("records.rank*.jsonl") if p.stem.removeprefix("records.rank").isdigit()]
    return sorted(files, key=lambda p: int(p.stem.removeprefix("records.rank")))


def existing_records(out_dir: str | Path, *, repair: bool) -> list[Record]:
    """All records already in `out_dir`: `records.jsonl`, then every shard file by rank.

    Args:
        out_dir: the run directory.
        repair: drop torn last lines from the files (`records.read_records(repair=True)`), so
            appends continue on a clean line. Only one process may repair, before any appends.
    Returns:
        the records in file order (duplicates possible: a merged file repeats shard records).
    """
    out_dir = Path(out_dir)
    paths = [out_dir / RECORDS] + shard_files(out_dir)
    recs: list[Record] = []
    for p in paths:
        if p.exists():
            recs.extend(read_records(p, repair=repair))
    return recs


def merge_records(records: list[Record | dict], sample_order: list[str], arm_order: list[str]) -> list[Record]:
    """One record per (arm, sample) (`records.dedupe`: the last written wins) sorted canonically.

    Args:
        records: records from every source, earlier sources first.
        sample_order: every sample id in the runner's order (turn-1 samples, then turn 2).
        arm_order: arm labels in the runner's order (`ar` first).
    Returns:
        records ordered by (sample position, arm position); unknown samples or arms (e.g. from an
        earlier config of the same run) sort after the known ones, by name.
    """
    s_pos = {s: i for i, s in enumerate(sample_order)}
    a_pos = {a: i for i, a in enumerate(arm_order)}
    def key(r: Record) -> tuple:
        s, a = r.sample_id, r.arm
        return (s_pos.get(s, len(s_pos)), s, a_pos.get(a, len(a_pos)), a)

    return sorted(dedupe(as_records(records)), key=key)


def merge_run_dir(out_dir: str | Path, sample_order: list[str], arm_order: list[str]) -> list[Record]:
    """Merge `records.jsonl` and every shard file of `out_dir` into one `records.jsonl`
    (written to a temporary file, then renamed: a crash leaves the old file or the new one).
    The shard files stay (provenance, and a later resume reads them too).

    Returns:
        the merged records.
    """
    out_dir = Path(out_dir)
    merged = merge_records(existing_records(out_dir, repair=True), sample_order, arm_order)
    rewrite_records(out_dir / RECORDS, merged)
    return merged


def compare_runs(dir_a: str | Path, dir_b: str | Path, fields: tuple[str, ...] = COMPARE_FIELDS) -> dict:
    """Compare the `records.jsonl` of two run directories (e.g. 1 process vs 2) record by record.

    Args:
        dir_a, dir_b: run directories.
        fields: record fields that must be equal per (arm, sample_id).
    Returns:
        JSON-serializable: `n_a`, `n_b` (records), `duplicates_a/_b`, `only_in_a/_b` (keys, first
        20), `n_compared`, `n_equal`, `differing` (first 20 as {"key", "fields"}), `ranks_a/_b`
        (ranks that produced records; [] for a 1-process run), `wall_s_a/_b` (sum of the
        records' generation wall times), `equal` (same keys, no duplicates, all fields equal).
    """
    def load(d) -> tuple[dict, int, list[int], float]:
        recs = read_records(Path(d) / RECORDS)
        by_key = {(r.arm, r.sample_id): r for r in dedupe(recs)}
        ranks = sorted({int(r.rank) for r in recs if r.rank is not None})
        return by_key, len(recs) - len(by_key), ranks, float(sum(r.wall_s or 0.0 for r in recs))

    a, dup_a, ranks_a, wall_a = load(dir_a)
    b, dup_b, ranks_b, wall_b = load(dir_b)
    common = sorted(set(a) & set(b))
    differing = []
    for k in common:
        bad = [f for f in fields if getattr(a[k], f) != getattr(b[k], f)]
        if bad:
            differing.append({"key": list(k), "fields": bad})
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    return {
        "n_a": len(a) + dup_a, "n_b": len(b) + dup_b, "duplicates_a": dup_a, "duplicates_b": dup_b,
        "only_in_a": [list(k) for k in only_a[:20]], "only_in_b": [list(k) for k in only_b[:20]],
        "n_compared": len(common), "n_equal": len(common) - len(differing), "differing": differing[:20],
        "n_differing": len(differing), "fields": list(fields), "ranks_a": ranks_a, "ranks_b": ranks_b,
        "wall_s_a": wall_a, "wall_s_b": wall_b,
        "equal": not differing and not only_a and not only_b and dup_a == dup_b == 0 and bool(common),
    }
