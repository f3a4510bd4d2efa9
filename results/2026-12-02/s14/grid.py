"""Counts of the exact-mode grid from the device's records (run on the CPU, repository root):

    python results/2026-12-02/s14/grid.py DIR     # DIR: the unpacked ev/ of e.tgz

Per run directory, complete or cut short by the budget: the speculative records the runner marked
identical to the run's own AR arm (`identical_to_ar`) and the mean accepted drafts per step, by
arm; then each batch-1 directory's (arm, sample) pairs against the batch-8 run of the same drafter
(`sharding.compare_runs` on the tokens, as `eval/report.py --same-tokens`)."""
import sys
from collections import defaultdict
from pathlib import Path

from dflash2.engine.stats import tau_pooled
from dflash2.evaluation.records import RECORDS, read_records
from dflash2.evaluation.sharding import compare_runs


def main(root: Path) -> None:
    runs = sorted(d for d in root.iterdir() if (d / RECORDS).is_file())
    for d in runs:
        recs = read_records(d / RECORDS)
        by_arm = defaultdict(list)
        for r in recs:
            if r["arm_kind"] != "ar":
                by_arm[r["arm"]].append(r)
        arms = ", ".join(f"{a.split('@')[-1]} {sum(r['identical_to_ar'] is True for r in rs)}/{len(rs)} "
                         f"(acc {tau_pooled([r['accepted'] for r in rs]) - 1:.2f})" for a, rs in by_arm.items())
        n_ar = sum(r["arm_kind"] == "ar" for r in recs)
        state = "complete" if (d / "summary.json").exists() else "partial"
        print(f"{d.name}: {state}, exact_impl/width {recs[0].get('exact_impl')}/{recs[0].get('exact_block_size')}, "
              f"AR {n_ar}: {arms}")
    for d in runs:
        batched = d.with_name(d.name.split("_b1_")[0] + "_bs8")
        if "_b1_" in d.name and (batched / RECORDS).is_file():
            res = compare_runs(batched, d, fields=("tokens",))
            print(f"{d.name} vs batch 8: {res['n_equal']}/{res['n_compared']} (arm, sample) pairs the same tokens")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
