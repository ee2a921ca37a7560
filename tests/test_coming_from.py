"""``docs/coming-from.md`` names only Forge settings that exist, with values Forge accepts.

The page maps other trainers' names to Forge's. Its tables' first column holds the other
trainer's names; everywhere else, a code span that starts with a config section
(``train.steps``, ``data.packer: bfd``) is a Forge key: it must be a key of the schema
(:mod:`forge_core.config.schema`) or an option of a built-in component, and a value
given with it (``key: value`` or ``key=value``), together with the other values of the
same table row, must load as an override. Every ``--flag`` of a ``forge-run`` command on
the page must be an option of that command.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from doc_chapters import without_code

from forge_core import docgen
from forge_core.cli.main import build_parser
from forge_core.config.loader import load_config

PAGE = Path(__file__).resolve().parent.parent / "docs" / "coming-from.md"
SECTIONS = ("run", "model", "attention", "data", "parallel", "train", "checkpoint", "logging", "plugins")
#: A Forge key in a span; a file name such as ``train.yaml`` is not one.
_KEY = re.compile(
    rf"(?<![\w.\-/])((?:{'|'.join(SECTIONS)})\.[A-Za-z_][\w.]*\w)(?<!\.yaml)(?<!\.yml)(?<!\.py)(?![\w.])"
)
_SETTING = re.compile(rf"^((?:{'|'.join(SECTIONS)})\.[\w.]+)(?:=|: )(.+)$")


def forge_spans(markdown: str) -> list[list[str]]:
    """The code spans that speak of Forge, grouped: one group per table row, one per
    paragraph elsewhere. The first cell of a table row (the other trainer's name) is left out."""
    groups: list[list[str]] = []
    for block in re.split(r"\n\s*\n", without_code(markdown)):
        rows = block.splitlines() if block.lstrip().startswith("|") else [block]
        for row in rows:
            if row.lstrip().startswith("|"):
                cells = re.split(r"(?<!\\)\|", row.strip().strip("|"))
                row = "|".join(cells[1:])
            spans = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", row)]
            if spans:
                groups.append(spans)
    return groups


def _known_keys() -> set[str]:
    return set(docgen.config_keys()) | set(docgen.component_option_keys(docgen.builtin_registries()))


def _flag_problems(span: str, parser_of: dict) -> list[str]:
    words = shlex.split(span)[1:]
    command = words[0] if words and words[0] in parser_of else "train"
    known = {flag for action in parser_of[command]._actions for flag in action.option_strings}  # noqa: SLF001
    return [
        f"`{span}`: forge-run {command} has no option {w.split('=')[0]}"
        for w in words
        if w.startswith("--") and w.split("=")[0] not in known
    ]


def page_problems(markdown: str, tmp: Path) -> list[str]:
    """Every Forge key, value and ``forge-run`` option of ``markdown`` that Forge does not have."""
    known = _known_keys()
    parser_of = docgen.subcommands(build_parser())
    registries = docgen.builtin_registries()
    empty = tmp / "empty.yaml"
    empty.write_text("{}\n")
    problems = []
    for spans in forge_spans(markdown):
        overrides = []
        for span in spans:
            if span.startswith("forge-run"):
                problems += _flag_problems(span, parser_of)
                settings = [w for w in shlex.split(span) if _SETTING.match(w)]
            else:
                setting = _SETTING.match(span)
                settings = [f"{setting.group(1)}={setting.group(2)}"] if setting else []
            overrides += settings
            for key in _KEY.findall(span):
                if key not in known:
                    problems.append(f"`{span}`: {key} is not a Forge setting")
        if overrides:
            try:
                load_config(empty, overrides, registries)
            except Exception as exc:  # noqa: BLE001 - the config error's message is the report
                problems.append(f"{' '.join(overrides)}: {exc}")
    return problems


def test_every_forge_key_value_and_option_on_the_page_exists(tmp_path):
    markdown = PAGE.read_text()
    groups = forge_spans(markdown)
    named = {key for spans in groups for span in spans for key in _KEY.findall(span)}
    assert {
        "train.steps",
        "train.batch_size",
        "train.grad_accum",
        "checkpoint.every",
        "train.grad_clip",
        "train.lr",
        "train.warmup_steps",
    } <= named
    problems = page_problems(markdown, tmp_path)
    assert not problems, "docs/coming-from.md:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("row", "complaint"),
    [
        ("| `max_steps` | `train.max_steps` | |", "train.max_steps is not a Forge setting"),
        ("| `bf16=True` | `train.precision: fp16` | |", "train.precision=fp16"),
        ("| `lr` | `train.schedule: cosine`, `train.schedule_options.decay_shape: sqrt` | |", "decay_shape"),
        ("Launch with `forge-run --gpus 2 x.yaml`.", "forge-run train has no option --gpus"),
        (
            "Sample with `forge-run sample run --prompt x --num-beams 4`.",
            "forge-run sample has no option --num-beams",
        ),
        ("Train with `forge-run train.yaml train.stpes=5`.", "train.stpes is not a Forge setting"),
    ],
)
def test_the_check_notices_a_setting_forge_lacks(tmp_path, row, complaint):
    page = f"# Page\n\n| other | Forge | note |\n| --- | --- | --- |\n{row}\n"
    problems = page_problems(page, tmp_path)
    assert any(complaint in p for p in problems), problems


def test_the_other_trainers_column_is_not_read_as_forge(tmp_path):
    page = "| torchtitan | Forge |\n| --- | --- |\n| `checkpoint.interval` | `checkpoint.every` |\n"
    assert forge_spans(page) == [["checkpoint.every"]]
    assert page_problems(page, tmp_path) == []
