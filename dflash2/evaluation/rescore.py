"""Score existing records again from their text: GSM8K's answer check and HumanEval's sandboxed
tests (`eval/report.py DIR --rescore`).

For records scored where the scorer could not run (a machine whose sandbox could not start its
harness), or after a scorer changes. Scoring is a function of the record's `text` and its item
alone, so rescoring on another machine gives what the run would have recorded there. Each
distinct (item, completion) runs once.
"""

from __future__ import annotations

from collections.abc import Iterable


def rescore(records: Iterable[dict], *, source: str = "local", limits=None) -> tuple[list[dict], int]:
    """`(records with correct / exec_result / sandbox scored again, number whose correct changed)`.

    Args:
        records: dicts of `records.jsonl` (GSM8K and HumanEval ones are rescored; others kept).
        source: where the items come from (`dflash2.evaluation.datasets`).
        limits: `SandboxLimits` for HumanEval (defaults when None).
    Raises:
        SandboxHarnessError: the sandbox cannot run here (nothing is changed).
    """
    from dflash2.evaluation import datasets as ds
    from dflash2.evaluation.sandbox import check_humaneval
    from dflash2.evaluation.scoring import gsm8k_correct, humaneval_completion

    records = [dict(r) for r in records]
    items = {}
    for name in {r["dataset"] for r in records} & {"gsm8k", "humaneval"}:
        items.update({f"{name}/{it.item_id}": it for it in ds.load_items(name, source=source)})
    cache: dict[tuple[str, str], dict] = {}
    changed = 0
    for r in records:
        item = items.get(r["sample_id"])
        if item is None:
            continue
        before = r.get("correct")
        if r["dataset"] == "gsm8k":
            r["correct"] = gsm8k_correct(r["text"], item.reference)
        else:
            completion = humaneval_completion(r["text"], item.problem)
            key = (r["sample_id"], completion)
            if key not in cache:
                cache[key] = check_humaneval(item.problem, completion, limits)
            res = cache[key]
            r.update(correct=bool(res["passed"]), exec_result=res["result"], sandbox=res["isolation"])
        changed += before != r["correct"]
    return records, changed
