"""GSM8K answer extraction on tricky strings, HumanEval code extraction, the judge hook."""

from fractions import Fraction

import pytest

from dflash2.evaluation.running.scoring import (
    extract_gsm8k_answer,
    gsm8k_correct,
    gsm8k_reference,
    humaneval_completion,
    load_judge,
    normalize_number,
)


@pytest.mark.parametrize("text, expected", [
    ("She makes 9 * 2 = $18 every day.\n#### 18", Fraction(18)),
    ("#### 1,234", Fraction(1234)),
    ("The answer is \\boxed{42}.", Fraction(42)),
    ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
    ("so x = \\boxed{1{,}000} dollars", Fraction(1000)),
    ("\\boxed{\\$18.00}", Fraction(18)),
    ("\\boxed{50\\%}", Fraction(50)),
    ("\\boxed{7 \\text{ apples}}", Fraction(7)),
    ("first \\boxed{3} then corrected \\boxed{5}", Fraction(5)),  # the last box counts
    ("\\boxed{\\text{x}=12}", Fraction(12)),  # not a bare number: its last number
    ("He has 3 apples, buys 4 more, so 7.", Fraction(7)),  # trailing period
    ("The total is $1,050.50.", Fraction(2101, 2)),
    ("It drops to -5 degrees", Fraction(-5)),
    ("-0", Fraction(0)),
    ("half: 1/2", Fraction(1, 2)),
    ("Costs .5 dollars", Fraction(1, 2)),
    ("#### 72\nSome trailing chatter with 99", Fraction(72)),  # the marker beats later numbers
    ("no digits here", None),
    ("", None),
])
def test_gsm8k_extraction(text, expected):
    assert extract_gsm8k_answer(text) == expected


def test_gsm8k_correct_compares_values_not_strings():
    ref = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 18"
    assert gsm8k_reference(ref) == 18
    assert gsm8k_correct("So she makes \\boxed{18.00}", ref)
    assert gsm8k_correct("Answer: $18.", ref)
    assert not gsm8k_correct("Answer: 180", ref)
    assert not gsm8k_correct("I do not know", ref)
    with pytest.raises(ValueError, match="####"):
        gsm8k_reference("no marker")


def test_normalize_rejects_garbage():
    assert normalize_number("abc") is None
    assert normalize_number("1/0") is None
    assert normalize_number("1,000,000") == 1_000_000


PROBLEM = {"task_id": "HumanEval/0", "entry_point": "add",
           "prompt": "import math\n\ndef add(a, b):\n    \"\"\"Add.\"\"\"\n",
           "test": "def check(f):\n    assert f(1, 2) == 3\n"}


def test_humaneval_full_function_in_fence_keeps_prompt_helpers():
    text = "Here you go:\n```python\ndef add(a, b):\n    return math.floor(a) + b\n```\nDone."
    comp = humaneval_completion(text, PROBLEM)
    program = PROBLEM["prompt"] + comp + "\n" + PROBLEM["test"] + "check(add)\n"
    ns: dict = {}
    exec(program, ns)  # trusted, tiny: the prompt's `import math` must still be in scope
    assert comp.startswith("    pass\n")


def test_humaneval_body_continuation_and_fence_choice():
    assert humaneval_completion("    return a + b\n", PROBLEM) == "    return a + b\n"
    text = "```python\nprint('usage')\n```\n```python\ndef add(a, b):\n    return a + b\n```"
    assert "def add" in humaneval_completion(text, PROBLEM)
    assert humaneval_completion("```python\n    return a + b\n", PROBLEM) == "    return a + b\n"  # unclosed fence


def test_judge_hook():
    judge = load_judge("builtins:len")
    assert judge([1, 2]) == 2
    assert load_judge(None) is None
    with pytest.raises(ValueError, match="module:function"):
        load_judge("nojudge")
    with pytest.raises(ValueError, match="cannot be imported"):
        load_judge("dflash2_no_such_module:judge")
