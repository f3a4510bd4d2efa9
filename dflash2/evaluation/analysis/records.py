"""The evaluation record: one per (arm, sample), the unit every statistic, report and plot of
an evaluation is computed from (log-first evaluation: the records alone rebuild everything).

`Record` below is the one list of a record's fields, with their types and meaning, and the type
records have in memory: the runner builds them, `read_records` returns them, and the statistics,
cost model, checks, comparison, sharding and W&B read their typed fields. On disk a run
directory holds `records.jsonl` (one `Record.to_json()` per line, written through
`dflash2.jsonl`: fsynced, NaN as null) and, for a sharded run, `shards/records.rank<r>.jsonl`;
reading and writing a file round-trips it byte for byte. Every field is written, None as null,
except the verify fields (`LATER_FIELDS`: added with the verify policies), which are written
only when set, so the files of runs made before them (`results/qwen05b_ablation`) still
round-trip byte for byte. `Record.from_json` is the gate every
JSON dict passes on its way in: unknown fields and missing required ones are refused with one
clear error. The public readers also take such dicts (`as_records`), so a test or a script may
hand them plain JSON rows.

Rules:
- **Torn lines** (`dflash2.jsonl`): reading only (`read_records(path)`), a torn last line is
  skipped with a warning; before appending on resume (`read_records(path, repair=True)`), it is
  dropped and the file rewritten atomically.
- **One record per (arm, temperature, sample_id)** (`record_key`, `dedupe`): the *last written
  wins*, kept at the position of the first occurrence. The runner never writes a finished pair
  twice, so within one run a duplicate is a copy (a merged `records.jsonl` repeating its shard
  files); across files concatenated by hand, the later line is the newer measurement, which is
  the one a resumed or repeated run means to keep.

Public: `Record`, `FIELDS`, `REQUIRED`, `LATER_FIELDS`, `ARM_KINDS`, `RECORDS`, `as_records`, `arm_family`,
`verify_of`, `record_key`,
`dedupe`, `validate`, `exact_of_records`, `append_records`, `rewrite_records`, `read_records`,
`read_run_records`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash2.evaluation.arms import MAX_TREE_BUDGET, VERIFY_POLICIES, forward_rows, kind_names, kind_of
from dflash2.jsonl import append_jsonl, read_jsonl, repair_jsonl, rewrite_jsonl

RECORDS = "records.jsonl"
ARM_KINDS = kind_names()  # the registered arm kinds (`dflash2.evaluation.arms`)


@dataclass(frozen=True)
class Record:
    """One (arm, sample) generation of an evaluation run.

    Identity:
        arm: the arm's unique label, e.g. "ar", "dflash2@N=7", "selector_off@N=7", "oracle@N=3".
        arm_kind: one of `ARM_KINDS`, the kinds registered in `dflash2.evaluation.arms` ("spec" is
            the DFlash2 drafter with its selector).
        num_speculative_tokens: N, draft slots per step (0 for the AR arm).
        temperature: sampling temperature of the run (0 = greedy).
        dataset: "gsm8k" | "humaneval" | "mt_bench" (or a test's name).
        sample_id: unique within the dataset, e.g. "gsm8k/0007", "mt_bench/81/turn2".
    Generation:
        tokens: the generated token ids (prompt excluded), length G.
        steps: decoding steps (the token sampled right after prefill is not a step).
        accepted: `[steps]`, accepted draft tokens per step, each in 0..N (tau counts a + 1).
        finish_reason: the engine's reason ("stop", "length", ...).
        wall_s: wall seconds of the generation call divided by its batch's rows (rows of one
            batch share one timing; see `batch`).
    Optional (None when not measured):
        run_id: the run identity hash (`run.json`); category: MT-Bench category; seed: the
        sample's seed (a hash of (seed, sample_id)); prompt_hash, prompt_tokens: the prompt's
        sha256 prefix and length; text: the decoded output; batch_size: rows of its batch;
        batch: "<phase>/<chunk>", the same for every arm of one chunk (the unit a speedup CI
        resamples); correct: scorer verdict (GSM8K, HumanEval); exec_result, sandbox: the
        HumanEval sandbox's result and isolation; judge_score: MT-Bench judge score;
        logprob_mean: the target's mean per-token log-probability of `tokens` at the run's
        temperature; identical_to_ar: tokens equal the AR arm's (None for the AR arm);
        departure: {"position", "margin", "top1", "top2"} at the first token that differs from
        the AR arm's (the target's top-1/top-2 logit gap there); target, draft_path,
        num_draft_layers: what generated it; rank, world_size: the process of a sharded run;
        exact_block_size: in exact mode, its width, one value for every arm of the run
        (`runner.exact_width`): every target forward's padded width with `exact_impl="rows"`, the
        attention's fixed query tile with `"invariant"`; None otherwise.
        exact_impl: in exact mode, how it ran (`"rows"` or `"invariant"`, as resolved); None otherwise.
    Verify (`LATER_FIELDS`; None in records written before them, which ran the chain):
        verify_policy: `speculative_generate`'s `verify=` ("chain", "adaptive", "tree"; "chain"
        for the AR arm); tree_budget: the tree's nodes per step, root included, exactly when
        the policy is "tree"; verify_lengths: `[steps]`, each step's verify length (the engine's
        `SpeculativeOutput.verify_lengths`: N for chain and tree, 1..N for adaptive, 0 for AR),
        `accepted[k] <= verify_lengths[k]`; verify_rows: `[steps]`, the rows a verify of that
        step's own length scores (`arms.verify_rows`: L + 1 for chain and adaptive, the budget
        for tree, 1 for AR). For adaptive that is the ragged count: today's forward scores N + 1;
        exact mode adds its padding and, for a tree, the confirming chain forward
        (`arms.forward_rows`, `verify_of`).
    """

    arm: str
    arm_kind: str
    num_speculative_tokens: int
    temperature: float
    dataset: str
    sample_id: str
    tokens: list[int]
    steps: int
    accepted: list[int]
    finish_reason: str
    wall_s: float
    run_id: str | None = None
    category: str | None = None
    seed: int | None = None
    prompt_hash: str | None = None
    prompt_tokens: int | None = None
    text: str | None = None
    batch_size: int | None = None
    batch: str | None = None
    correct: bool | None = None
    exec_result: str | None = None
    sandbox: str | None = None
    judge_score: float | None = None
    logprob_mean: float | None = None
    identical_to_ar: bool | None = None
    departure: dict | None = None
    target: str | None = None
    draft_path: str | None = None
    num_draft_layers: int | None = None
    rank: int | None = None
    world_size: int | None = None
    exact_block_size: int | None = None
    exact_impl: str | None = None
    verify_policy: str | None = None
    tree_budget: int | None = None
    verify_lengths: list[int] | None = None
    verify_rows: list[int] | None = None

    def __post_init__(self) -> None:
        where = f"record (arm={self.arm!r}, sample_id={self.sample_id!r})"
        if not isinstance(self.tokens, (list, tuple)) or not isinstance(self.accepted, (list, tuple)):
            raise ValueError(f"{where}: tokens and accepted must be lists, got {type(self.tokens).__name__} "
                             f"and {type(self.accepted).__name__}")
        if self.arm_kind not in kind_names():
            raise ValueError(f"{where}: arm_kind {self.arm_kind!r} is not one of {kind_names()}")
        n = int(self.num_speculative_tokens)
        bad = [a for a in self.accepted if not 0 <= int(a) <= n]
        if bad:
            raise ValueError(f"{where}: accepted counts {bad[:5]} outside 0..num_speculative_tokens={n}")
        if len(self.accepted) != int(self.steps):
            raise ValueError(f"{where}: {len(self.accepted)} accepted counts for {self.steps} steps")
        self._check_verify(where, n)

    def _check_verify(self, where: str, n: int) -> None:
        """The verify fields' contract (class docstring); ValueError naming the record otherwise."""
        if self.verify_policy is not None and self.verify_policy != kind_of(self.arm_kind).verify:
            raise ValueError(f"{where}: verify_policy {self.verify_policy!r}, but arm kind {self.arm_kind!r} runs "
                             f"{kind_of(self.arm_kind).verify!r} (policies: {VERIFY_POLICIES})")
        if (self.tree_budget is not None) != (self.verify_policy == "tree"):
            raise ValueError(f"{where}: tree_budget={self.tree_budget} with verify_policy={self.verify_policy!r} "
                             "(a budget goes with the tree policy, and only with it)")
        if self.tree_budget is not None and not 1 <= int(self.tree_budget) <= MAX_TREE_BUDGET:
            raise ValueError(f"{where}: tree_budget={self.tree_budget} outside 1..{MAX_TREE_BUDGET}")
        for name in ("verify_lengths", "verify_rows"):
            seq = getattr(self, name)
            if seq is None:
                continue
            if not isinstance(seq, (list, tuple)) or len(seq) != int(self.steps):
                raise ValueError(f"{where}: {name} must be a list of one value per step ({self.steps} steps)")
        if self.verify_lengths is not None:
            bad = [(a, v) for a, v in zip(self.accepted, self.verify_lengths) if not int(a) <= int(v) <= n]
            if bad:
                raise ValueError(f"{where}: (accepted, verify length) pairs {bad[:5]} break accepted <= verify "
                                 f"length <= num_speculative_tokens={n}")
        if self.verify_rows is not None and any(int(r) < 1 for r in self.verify_rows):
            raise ValueError(f"{where}: verify_rows must be >= 1 per step")

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Record:
        """The record of a JSON dict. Raises ValueError naming the record when `row` has a field
        `Record` does not define or lacks a required one (see `REQUIRED`)."""
        where = f"record (arm={row.get('arm')!r}, sample_id={row.get('sample_id')!r})"
        unknown = sorted(set(row) - set(FIELDS))
        if unknown:
            raise ValueError(f"{where} has unknown fields {unknown}; the record's fields are defined by "
                             "dflash2.evaluation.analysis.records.Record")
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"{where} lacks the required fields {missing} "
                             "(dflash2.evaluation.analysis.records.Record)")
        return cls(**row)

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON types (lists for the sequences), None as None, except the
        `LATER_FIELDS`, which appear only when set (module docstring)."""
        out = {f: getattr(self, f) for f in FIELDS if f not in LATER_FIELDS or getattr(self, f) is not None}
        out["tokens"], out["accepted"] = list(self.tokens), list(self.accepted)
        for f in ("verify_lengths", "verify_rows"):
            if f in out:
                out[f] = list(out[f])
        return out


FIELDS = tuple(f.name for f in dataclasses.fields(Record))
REQUIRED = tuple(f.name for f in dataclasses.fields(Record) if f.default is dataclasses.MISSING)
LATER_FIELDS = ("verify_policy", "tree_budget", "verify_lengths", "verify_rows")  # written only when set


def verify_of(rec: Record) -> dict[str, Any]:
    """A record's verify policy as read by the analyses, also for records written before the
    verify fields: `policy` (its `verify_policy`, else its kind's declared `ArmKind.verify`),
    `tree_budget`, `lengths` (per step; N per step when not recorded), `rows` (per step, the
    recorded `verify_rows`, else the forward's rows) and `forward_rows` (what one step's forwards
    score, `arms.forward_rows`, in the record's exact mode)."""
    policy = rec.verify_policy or kind_of(rec.arm_kind).verify
    n = int(rec.num_speculative_tokens)
    budget = rec.tree_budget
    fwd = n + 1 if policy == "tree" and budget is None else forward_rows(  # (a tree's budget unrecorded)
        policy, n, budget, exact_impl=rec.exact_impl, exact_block_size=rec.exact_block_size)
    lengths = list(rec.verify_lengths) if rec.verify_lengths is not None else [n] * int(rec.steps)
    rows = list(rec.verify_rows) if rec.verify_rows is not None else [fwd] * int(rec.steps)
    return {"policy": policy, "tree_budget": budget, "lengths": lengths, "rows": rows, "forward_rows": fwd}


def as_records(rows: Iterable[Record | Mapping[str, Any]]) -> list[Record]:
    """`rows` as `Record`s: records pass as they are, JSON dicts through `Record.from_json`."""
    return [r if isinstance(r, Record) else Record.from_json(r) for r in rows]


def validate(rows: Iterable[Record | Mapping[str, Any]]) -> list[dict]:
    """`rows` checked and completed through `Record`, as JSON dicts (`Record.to_json`: every field
    present, None when unset, but the `LATER_FIELDS` only when set)."""
    return [r.to_json() for r in as_records(rows)]


def arm_family(arm: str) -> str:
    """An arm's label without its `@N=...`: "dflash2@N=7" -> "dflash2", "oracle@N=3|T=1" ->
    "oracle|T=1", "tree32@N=15" -> "tree32", "ar" -> "ar". The name of that arm's family in
    plots, tables and the cost model (a tree kind's budgets are families of their own)."""
    return re.sub(r"@N=\d+", "", arm)


def record_key(rec: Record | Mapping[str, Any]) -> tuple[str, float, str]:
    """(arm, temperature, sample_id): what identifies one record of a run (or a T grid)."""
    if isinstance(rec, Record):
        return rec.arm, float(rec.temperature), rec.sample_id
    return rec["arm"], float(rec["temperature"]), rec["sample_id"]


def dedupe(records: Iterable[Record]) -> list[Record]:
    """One record per `record_key`: the last written wins, at its key's first position."""
    latest: dict[tuple, Record] = {}
    for r in records:
        latest[record_key(r)] = r
    return list(latest.values())


def exact_of_records(records: list[Record]) -> dict:
    """summary.json's `exact`, `exact_block_size` and `exact_impl`, read from the records, where
    the runner recorded the run's resolved exact mode (`runner.resolve_exact`, `runner.exact_width`): a record
    has a width exactly when it ran in exact mode. One value each, or the sorted list when the
    records disagree; None (and `exact` false) when no record ran in exact mode."""
    widths = sorted({r.exact_block_size for r in records} - {None})
    impls = sorted({r.exact_impl for r in records} - {None})
    one = lambda vs: vs[0] if len(vs) == 1 else (vs or None)  # noqa: E731
    return {"exact_block_size": one(widths), "exact": bool(widths), "exact_impl": one(impls) if widths else None}


def append_records(path: str | Path, records: Iterable[Record | Mapping[str, Any]]) -> None:
    """Append records to `path` (validated, fsynced, NaN as null)."""
    append_jsonl(path, validate(records))


def rewrite_records(path: str | Path, records: Iterable[Record | Mapping[str, Any]]) -> None:
    """Replace `path` by `records`, atomically (validated, NaN as null)."""
    rewrite_jsonl(path, validate(records))


def read_records(path: str | Path, *, repair: bool = False) -> list[Record]:
    """The `Record`s of one JSONL file, in file order (duplicates kept; see `dedupe`).

    Args:
        path: a records file.
        repair: True before appending to it on resume (a torn last line is dropped and the file
            rewritten atomically; a missing file gives []). False to only read (a torn last line
            is skipped with a warning; a missing file raises FileNotFoundError).
    """
    path = Path(path)
    if repair:
        return as_records(repair_jsonl(path))
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a run directory that eval/run.py wrote")
    return as_records(read_jsonl(path))


def read_run_records(run_dir: str | Path) -> list[Record]:
    """The records of a finished (or killed) run directory, read only, one per `record_key`.
    Raises FileNotFoundError without `records.jsonl`, ValueError when it holds no records."""
    path = Path(run_dir) / RECORDS
    records = dedupe(read_records(path))
    if not records:
        raise ValueError(f"{path} holds no records")
    return records
