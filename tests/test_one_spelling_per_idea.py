"""One spelling per idea, checked over the source: a documented option is declared with
``forge_core.api.option`` and nothing else, the ignore label ``-100`` is written once
(``forge_core.api.IGNORE_INDEX``), and the batch keys are spelled by their constants
(``INPUT_IDS``, ``LABELS``, ``DOC_IDS``, ``POSITIONS``).

The scan covers the kernel, the built-in plugins, the example package and the benches;
for options also the code blocks of the docs, which plugin authors copy (the docs may
show ``-100`` and the keys' values, which is what a reader sees in a batch). Each
detector is also run on a snippet that breaks its rule, so a detector that stopped
seeing would fail here."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import REPO

SCANNED = ("forge_core", "forge_plugins", "examples", "bench")
#: Where each idea is defined: the one place its spelling may appear.
OPTION_HOME = "forge_core/api/options.py"
BATCH_HOME = "forge_core/api/batch.py"
BATCH_KEYS = {"input_ids", "labels", "doc_ids", "positions"}
#: Strings equal to a batch key that name something else: another library's key.
FOREIGN_KEYS = {
    ("forge_plugins/tokenizers/hf.py", "input_ids"): "the key of a transformers BatchEncoding",
    ("bench/packing.py", "input_ids"): "the column trl's pack_dataset packs",
}
#: The example package's tests compare packed rows with literal lists on purpose: they
#: pin the wire format a third-party packer must produce.
WIRE_FORMAT_TESTS = "examples/forge-plugin-example/tests"
FIELD_FACTORIES = {"attrs.field", "attr.ib", "attr.field", "attrs.attrib", "dataclasses.field", "field"}


def _sources(docs: bool = False) -> list[tuple[str, str]]:
    """``(where, source)`` of every Python file scanned and, with ``docs``, of every
    ``python`` code block of the docs (``where`` is the path relative to the repository)."""
    found = []
    for root in SCANNED:
        for path in sorted((REPO / root).rglob("*.py")):
            if ".venv" not in path.parts and "build" not in path.parts:
                found.append((path.relative_to(REPO).as_posix(), path.read_text()))
    for path in sorted((REPO / "docs").rglob("*.md")) if docs else ():
        blocks = re.findall(r"^```python\n(.*?)^```$", path.read_text(), re.M | re.S)
        found += [(f"{path.relative_to(REPO).as_posix()} (block {i})", b) for i, b in enumerate(blocks)]
    return found


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def option_helpers(source: str) -> list[str]:
    """Every spelling of a documented field other than ``option``: a ``{"doc": ...}``
    dict or ``dict(doc=...)``, a field factory given ``metadata``, and a function that
    returns a field factory's or ``option``'s result (a helper of one's own)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "doc" for k in node.keys
        ):
            found.append(f"line {node.lineno}: a {{'doc': ...}} metadata dict")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name == "dict" and any(k.arg == "doc" for k in node.keywords):
                found.append(f"line {node.lineno}: dict(doc=...)")
            elif name in FIELD_FACTORIES and any(k.arg == "metadata" for k in node.keywords):
                found.append(f"line {node.lineno}: {name}(metadata=...)")
        if isinstance(node, (ast.FunctionDef, ast.Lambda)):
            body = node.body if isinstance(node, ast.FunctionDef) else [ast.Return(node.body)]
            returned = [n.value for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Return)]
            wrapped = [_dotted(v.func) for v in returned if isinstance(v, ast.Call)]
            found += [
                f"line {node.lineno}: a function returning {name}(...)"
                for name in wrapped
                if name in FIELD_FACTORIES | {"option", "api.option"}
            ]
    return found


def ignore_labels(source: str) -> list[str]:
    """Every integer ``-100`` written in code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and node.operand.value == 100
        ):
            found.append(f"line {node.lineno}: -100")
        elif isinstance(node, ast.Constant) and type(node.value) is int and node.value == -100:
            found.append(f"line {node.lineno}: -100")
    return found


def batch_key_literals(source: str) -> list[tuple[int, str]]:
    """``(line, key)`` for every string literal that is exactly a batch key (docstrings
    and f-string fragments are prose and never equal one)."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in BATCH_KEYS
    ]


def test_the_scan_reads_every_place_options_are_declared():
    wheres = [where for where, _ in _sources(docs=True)]
    for expected in (
        "forge_core/config/schema.py",
        "forge_plugins/models/options.py",
        "examples/forge-plugin-example/forge_plugin_example/options.py",
        "bench/packing.py",
    ):
        assert expected in wheres
    assert any(w.startswith("docs/plugin-guide/optimizer.md (block") for w in wheres)


@pytest.mark.parametrize(
    "snippet",
    [
        'x: int = attrs.field(default=1, metadata={"doc": "One."})',
        'x: int = attrs.field(default=1, metadata=dict(doc="One."))',
        "x: int = attr.ib(default=1, metadata=META)",
        "def _opt(default, doc):\n    return attrs.field(default=default, metadata=make(doc))",
        "def documented(default, doc):\n    return option(default, doc)",
        '_doc = lambda text: {"doc": text}',
        "documented = lambda default, doc: option(default, doc)",
    ],
)
def test_the_option_detector_sees_a_second_helper(snippet):
    assert option_helpers(snippet)


def test_the_option_detector_accepts_the_one_helper():
    assert not option_helpers('x: int = option(1, "One.", at_least(1))\ny: list = attrs.field(factory=list)')


def test_every_documented_option_is_declared_with_forge_core_api_option():
    """A second helper (or raw ``metadata={"doc": ...}``) would be a second place the
    convention lives: the key the docs read, the copying of mutable defaults, the refusal
    of an undocumented option."""
    found = [
        f"{where}: {hit}"
        for where, source in _sources(docs=True)
        if where != OPTION_HOME
        for hit in option_helpers(source)
    ]
    assert not found, "declare documented fields with forge_core.api.option:\n" + "\n".join(found)


def test_the_ignore_detector_sees_both_spellings():
    assert ignore_labels("labels[eos] = -100") and ignore_labels("IGNORE = -100\nf(ignore_index=- 100)")
    assert not ignore_labels('"""labels are -100 at EOS"""\nx = -10')


def test_the_ignore_label_is_written_once():
    found = [
        f"{where}: {hit}"
        for where, source in _sources()
        if where != BATCH_HOME and not where.startswith(WIRE_FORMAT_TESTS)
        for hit in ignore_labels(source)
    ]
    assert not found, "use forge_core.api.IGNORE_INDEX:\n" + "\n".join(found)


def test_the_batch_key_detector_sees_a_literal_and_not_prose():
    assert batch_key_literals('batch["labels"]\nmeta = {"doc_ids": d}') == [(1, "labels"), (2, "doc_ids")]
    assert batch_key_literals('"""Returns input_ids and labels."""\nx = f"{n} positions"') == []


def test_batch_keys_are_spelled_by_their_constants():
    found = [
        f"{where}:{line}: {key!r}"
        for where, source in _sources()
        if where != BATCH_HOME and not where.startswith(WIRE_FORMAT_TESTS)
        for line, key in batch_key_literals(source)
        if (where, key) not in FOREIGN_KEYS
    ]
    assert not found, "use INPUT_IDS, LABELS, DOC_IDS, POSITIONS from forge_core.api:\n" + "\n".join(found)


def test_every_foreign_key_exception_is_still_needed():
    """An allowance whose literal is gone must go too, or it would hide a new one."""
    sources = dict(_sources())
    stale = [
        f"{where}: {key}"
        for where, key in FOREIGN_KEYS
        if key not in {k for _, k in batch_key_literals(sources[where])}
    ]
    assert not stale
