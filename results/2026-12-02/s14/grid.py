"""Counts of the exact-mode grid from the device's records (run on the CPU, repository root):

    python results/2026-12-02/s14/grid.py DIR     # DIR: the unpacked ev/ of e.tgz

Per run directory: speculative records identical to the run's own AR arm, by arm (complete runs
and the partial ones the budget cut); mean accepted drafts per step, by arm; then each batch-1
directory's (arm, sample) pairs against the batch-8 run of the same drafter (same tokens)."""
import collections
import json
import sys
from pathlib import Path


def records(d: Path) -> list[dict]:
    p = d / "records.jsonl"
    return [json.loads(line) for line in p.open() if line.strip()] if p.exists() else []


def main(root: Path) -> None:
    runs = {d.name: records(d) for d in sorted(root.iterdir()) if d.is_dir() and records(d)}
    for name, recs in runs.items():
        ar = {r["sample_id"]: r["tokens"] for r in recs if r["arm_kind"] == "ar"}
        same, total, acc, steps = (collections.Counter() for _ in range(4))
        for r in recs:
            if r["arm_kind"] == "ar":
                continue
            total[r["arm"]] += 1
            same[r["arm"]] += r["tokens"] == ar.get(r["sample_id"])
            acc[r["arm"]] += sum(r["accepted"])
            steps[r["arm"]] += r["steps"]
        impl = recs[0].get("exact_impl"), recs[0].get("exact_block_size")
        arms = ", ".join(f"{a.split('@')[-1]} {same[a]}/{total[a]} (acc {acc[a] / steps[a]:.2f})" for a in total)
        done = (root / name / "summary.json").exists()
        print(f"{name}: {'complete' if done else 'partial'}, exact_impl/width {impl}, AR {len(ar)}: {arms}")
    for name, recs in runs.items():
        if "_b1_" not in name:
            continue
        b8 = runs.get(name.split("_b1_")[0] + "_bs8", [])
        key = {(r["arm"], r["sample_id"]): r["tokens"] for r in b8}
        pairs = [(key[k], r["tokens"]) for r in recs if (k := (r["arm"], r["sample_id"])) in key]
        equal = sum(batched == alone for batched, alone in pairs)
        print(f"{name} vs batch 8: {equal}/{len(pairs)} (arm, sample) pairs the same tokens")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
