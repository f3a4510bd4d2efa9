"""Offline code and instruction prompts from the Python standard library (`data.source=stdlib`).

Every machine that runs this toolkit has the standard library's sources, and none of our
evaluation sets (GSM8K test, HumanEval, MT-Bench) is built from them, so they give a drafter
code and chat prompts beyond GSM8K-train without a hub. The target writes the answers
(regeneration, like GSM8K-train); only the prompts come from here.

Sources, read with `ast` from the `.py` files (nothing is imported or executed):
    public module-level functions and classes with a docstring of at least `MIN_DOC_CHARS`
        `implement`  write the function from its signature and documented behaviour  (code)
        `complete`   complete a stub: signature + docstring, HumanEval's prompt shape (code)
        `class`      write a class from its name, base classes and docstring          (code)
        `explain`    explain what `module.name` does, with an example                 (chat)
    public modules with a docstring
        `module`     what the module is for, its main parts, examples                 (chat)
    the language reference topics of `pydoc_data.topics`
        `topic`      explain a language construct to a learner                         (chat)

Rows are ordered by the SHA-256 of their id (a fixed pseudo-random order, so `data.limit=N`
keeps a mix of kinds and modules, and a name added by a newer Python only inserts itself).
The set depends on the running Python's standard library: the regenerated JSONL, which
stores every prompt, is what makes a training run reproducible elsewhere. Prompts that the
contamination guard would refuse are left out here, so the source never trips it.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import sysconfig
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

KINDS = ("implement", "complete", "class", "explain", "module", "topic")
MIN_DOC_CHARS = 40      # shorter docstrings say too little to write code from
MAX_DOC_CHARS = 1200    # longer ones are cut at a paragraph boundary before this
# Trees that are tests, demos, tools or platform glue rather than library APIs.
SKIP_DIRS = {"test", "tests", "idlelib", "turtledemo", "lib2to3", "ensurepip", "site-packages", "dist-packages",
             "pydoc_data", "__pycache__", "__phello__", "venv"}


def stdlib_dir() -> Path:
    """The running Python's pure-Python standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def _module_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(dotted module name, file) of every public module under `root`, in path order."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        parts = list(rel.parts[:-1]) + ([] if rel.name == "__init__.py" else [rel.stem])
        if not parts or any(p in SKIP_DIRS or p.startswith(("_", "config-")) or "-" in p for p in parts):
            continue
        yield ".".join(parts), path


def _trim(doc: str) -> str:
    """Docstring cut to whole paragraphs within MAX_DOC_CHARS (the first paragraph always kept)."""
    out = ""
    for para in doc.strip().split("\n\n"):
        if out and len(out) + 2 + len(para) > MAX_DOC_CHARS:
            break
        out = f"{out}\n\n{para}" if out else para
    return out[:MAX_DOC_CHARS].rstrip()


def _first_sentence(doc: str) -> str:
    para = " ".join(doc.strip().split("\n\n")[0].split())
    end = para.find(". ")
    return para if end < 0 else para[: end + 1]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    ret = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{prefix} {node.name}({ast.unparse(node.args)}){ret}"


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line if line.strip() else "" for line in text.splitlines())


def _definition_prompts(module: str, node: ast.AST) -> Iterator[tuple[str, str, str]]:
    """(kind, qualified name, prompt) for one public module-level function or class."""
    doc = ast.get_docstring(node)
    if not doc or len(doc) < MIN_DOC_CHARS or node.name.startswith("_"):
        return
    qual, body = f"{module}.{node.name}", _trim(doc)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        sig = _signature(node)
        yield "implement", qual, (
            f"Write a Python function with the signature `{sig}` that behaves as documented below. "
            f"Do not import or call the standard library's `{module}` module.\n\n{body}")
        yield "complete", qual, (
            f"Complete the following Python function.\n\n```python\n{sig}:\n"
            f'    """{_indent(body).lstrip()}\n    """\n```')
    else:
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        methods = [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and not (n.name.startswith("_") and n.name != "__init__")]
        shown = f" It should provide these methods: {', '.join(methods[:8])}." if methods else ""
        yield "class", qual, (
            f"Write a Python class `{node.name}`{f' deriving from {bases}' if bases else ''}.{shown} "
            f"Its documentation:\n\n{body}")
    yield "explain", qual, (
        f"What does `{qual}` in the Python standard library do? {_first_sentence(doc)} "
        "Explain when one would use it, its pitfalls, and show a short example.")


def _file_prompts(module: str, path: Path) -> Iterator[tuple[str, str, str]]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return  # a file this Python cannot parse (another version's syntax, or not UTF-8)
    doc = ast.get_docstring(tree)
    if doc and len(doc) >= MIN_DOC_CHARS:
        yield "module", module, (
            f"I am learning Python. What is the standard library module `{module}` for? "
            f"{_first_sentence(doc)} Describe its main functions and classes and show how to use them.")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _definition_prompts(module, node)


def _topic_prompts() -> Iterator[tuple[str, str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions ship the standard library without pydoc_data
        return
    for name in sorted(topics):
        first = " ".join(topics[name].strip().split("\n\n")[0].split())
        if len(first) < MIN_DOC_CHARS:
            continue
        yield "topic", name, (
            f"Explain this part of the Python language to someone who knows another programming language, "
            f"with small examples and common mistakes. The reference manual starts: \"{first[:400]}\"")


def _order(row_id: str) -> str:
    return hashlib.sha256(row_id.encode()).hexdigest()


def stdlib_prompts(kinds: tuple[str, ...] | list[str] = KINDS, root: Path | None = None) -> list[dict[str, str]]:
    """Prompts built from the standard library's sources and reference topics.

    Args:
        kinds: which prompt kinds to build (a subset of `KINDS`).
        root: the library directory to read (default `stdlib_dir()`).
    Returns:
        rows `{"id": "stdlib/<kind>/<qualified name>", "kind", "prompt"}`, unique ids, ordered by
        the SHA-256 of the id; prompts that equal or contain an evaluation prompt are left out.
    Raises:
        ValueError: an unknown kind, or no prompt found (the library sources are missing).
    """
    from dflash2.training.contamination import eval_index

    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"stdlib prompt kinds {unknown} are unknown; use some of {', '.join(KINDS)}")
    wanted, root = set(kinds), root or stdlib_dir()
    found: dict[str, dict[str, str]] = {}
    sources = [src for module, path in _module_files(root) for src in _file_prompts(module, path)]
    for kind, qual, prompt in sources + list(_topic_prompts()):
        row_id = f"stdlib/{kind}/{qual}"
        if kind in wanted and row_id not in found:  # a name defined twice in a module: the first wins
            found[row_id] = {"id": row_id, "kind": kind, "prompt": prompt}
    if not found:
        raise ValueError(f"no standard library prompts found under {root}; is the Python installation complete?")
    index = eval_index()
    rows = [r for r in found.values() if index.match(r["prompt"]) is None]
    if len(rows) < len(found):
        log.warning("stdlib prompts: %d left out because they match evaluation prompts", len(found) - len(rows))
    return sorted(rows, key=lambda r: _order(r["id"]))
