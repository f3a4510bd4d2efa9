"""Score existing records again from their text: GSM8K's answer check and HumanEval's sandboxed
tests (`eval/report.py DIR --rescore`).

For records scored where the scorer could not run (a machine whose sandbox could not start its
harness), or after a scorer changes. Scoring is a function of the record's `text` and its item
alone, so rescoring on another machine gives what the run would have recorded there. Each
distinct (item, completion) runs once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from dflash2.evaluation.analysis.records import Record, as_records


def rescore(records: Iterable[Record | dict], *, source: str = "local", limits=None) -> tuple[list[Record], int]:
    """`(records with correct / exec_result / sandbox scored again, number whose correct changed)`.

    Args:
        records: `Record`s (or their dicts) of `records.jsonl` (GSM8K and HumanEval ones are rescored;
            others kept).
        source: where the items come from (`dflash2.evaluation.running.datasets`).
        limits: `SandboxLimits` for HumanEval (defaults when None).
    Raises:
        SandboxHarnessError: the sandbox cannot run here (nothing is changed).
    """
    from dflash2.evaluation.running import datasets as ds
    from dflash2.evaluation.running.sandbox import check_humaneval
    from dflash2.evaluation.running.scoring import gsm8k_correct, humaneval_completion

    records = as_records(records)
    items = {}
    for name in {r.dataset for r in records} & {"gsm8k", "humaneval"}:
        items.update({f"{name}/{it.item_id}": it for it in ds.load_items(name, source=source)})
    cache: dict[tuple[str, str], dict] = {}
    changed, out = 0, []
    for before in records:
        r, item = before, items.get(before.sample_id)
        if item is not None and r.dataset == "gsm8k":
            r = dataclasses.replace(r, correct=gsm8k_correct(r.text, item.reference))
        elif item is not None:
            completion = humaneval_completion(r.text, item.problem)
            key = (r.sample_id, completion)
            if key not in cache:
                cache[key] = check_humaneval(item.problem, completion, limits)
            res = cache[key]
            r = dataclasses.replace(r, correct=bool(res["passed"]), exec_result=res["result"], sandbox=res["isolation"])
        changed += r.correct != before.correct
        out.append(r)
    return out, changed
