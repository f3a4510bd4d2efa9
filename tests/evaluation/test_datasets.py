"""Offline loaders: full sizes, limit/shuffle/seed, prompts per turn, few-shot."""

import pytest

from dflash2.evaluation.running import datasets as ds


@pytest.mark.parametrize("name, size", [("gsm8k", 1319), ("humaneval", 164), ("mt_bench", 80)])
def test_full_sizes_offline(name, size):
    items = ds.load_items(name, source="local")
    assert len(items) == size
    assert len({it.sample_id() for it in items}) == size


def test_item_contents():
    g = ds.load_items("gsm8k", source="local", limit=1)[0]
    assert g.sample_id() == "gsm8k/0000" and "####" in g.reference
    h = ds.load_items("humaneval", source="local", limit=1)[0]
    assert h.sample_id() == "humaneval/HumanEval-0"
    assert {"prompt", "test", "entry_point", "task_id"} <= set(h.problem) and h.problem["prompt"] in h.turns[0]
    mt = ds.load_items("mt_bench", source="local")
    assert all(len(it.turns) == 2 for it in mt)
    assert len({it.category for it in mt}) == 8
    assert mt[0].sample_id(2) == f"mt_bench/{mt[0].item_id}/turn2"


def test_limit_shuffle_seed_are_deterministic():
    a = [it.item_id for it in ds.load_items("gsm8k", source="local", limit=5, shuffle=True, seed=3)]
    b = [it.item_id for it in ds.load_items("gsm8k", source="local", limit=5, shuffle=True, seed=3)]
    c = [it.item_id for it in ds.load_items("gsm8k", source="local", limit=5, shuffle=True, seed=4)]
    assert a == b and a != c and len(a) == 5
    assert [it.item_id for it in ds.load_items("gsm8k", source="local", limit=2)] == ["0000", "0001"]
    with pytest.raises(ValueError, match="unknown dataset"):
        ds.load_items("mmlu", source="local")


def test_messages_turns_and_few_shot():
    q = ds.load_items("mt_bench", source="local", limit=1)[0]
    m1 = ds.messages_for(q, 1)
    assert [m["role"] for m in m1] == ["user"] and m1[0]["content"] == q.turns[0]
    m2 = ds.messages_for(q, 2, ["first answer"])
    assert [m["role"] for m in m2] == ["user", "assistant", "user"] and m2[1]["content"] == "first answer"
    with pytest.raises(ValueError, match="previous answers"):
        ds.messages_for(q, 2, [])
    g = ds.load_items("gsm8k", source="local", limit=1)[0]
    fs = ds.messages_for(g, few_shot=2, source="local")
    assert [m["role"] for m in fs] == ["user", "assistant"] * 2 + ["user"]
    assert "\\boxed{" in fs[1]["content"] and g.turns[0] in fs[-1]["content"]
