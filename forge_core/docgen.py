"""Write the generated documentation pages, or check that the committed ones are current.

Seven pages in ``docs/`` are produced from the code so they cannot drift from it:

- ``hooks.md``: every hookspec of :mod:`forge_core.hookspecs` with its exact signature and
  docstring, and the fields of every object a hook receives or returns;
- ``configuration.md``: every config key of :mod:`forge_core.config.schema` with type,
  default and meaning, and the options of every built-in component;
- ``cli.md``: the usage text of every ``forge-run`` command, from
  :func:`forge_core.cli.main.build_parser`;
- ``coming-from.md``: the tables of other trainers' settings under their Forge names,
  from :mod:`forge_core.config.foreign_keys`, which the unknown-key errors quote;
- ``reference/components.md`` and ``reference/rules.md``: ``forge-run plugins
  --markdown`` and ``forge-run rules --markdown`` for the built-in plugins only;
- ``plugin-guide/example-package.md``: the example package of ``examples/`` (its README
  and every file), so the site, which serves only ``docs/``, shows it whole.

The prose of a page lives in ``docs/templates/`` at the same path (``docs/templates/cli.md``
for ``docs/cli.md``), with ``{{name}}`` placeholders for what this module computes
(tables, lists, usage texts, docstrings) and fills in; the component and rule
references have no template, as ``forge-run`` prints them from an installed package.

Run ``python -m forge_core.docgen`` to rewrite them and ``python -m forge_core.docgen
--check`` to list stale ones (exit 1). Imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import re
import string
import sys
import textwrap
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from forge_core.api.options import option_key
from forge_core.api.unstable import option_doc
from forge_core.cli.main import build_parser, subcommands
from forge_core.reference import annotation_as_written, documented_meaning, resolved_fields, type_label

if TYPE_CHECKING:
    from forge_core.registry import Registries

REGENERATE = "python -m forge_core.docgen"
DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"
EXAMPLE_DIR = DOCS_DIR.parent / "examples" / "forge-plugin-example"
EXAMPLE_PAGE = "plugin-guide/example-package.md"
#: The prose of every generated page, with placeholders for what is computed.
TEMPLATES_DIR = DOCS_DIR / "templates"
HELP_WIDTH = 88


# --- helpers ------------------------------------------------------------------------


@contextlib.contextmanager
def _builtins_only() -> Iterator[None]:
    """Load only the built-in plugins, whatever is installed or blocked in this shell, so
    the generated references describe what ships with Forge."""
    from forge_core.plugins import AUTOLOAD_ENV, BLOCK_ENV

    saved = {key: os.environ.get(key) for key in (AUTOLOAD_ENV, BLOCK_ENV)}
    os.environ[AUTOLOAD_ENV] = "1"
    os.environ.pop(BLOCK_ENV, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def builtin_registries() -> Any:
    from forge_core.registry import load_registries

    with _builtins_only():
        return load_registries()


def rst_to_markdown(text: str) -> str:
    """The reStructuredText used in Forge docstrings, as Markdown: ````x```` becomes
    ```x```, ``:class:`~a.B``` becomes ```B```, a link ```text <target>`_`` becomes
    ``[text](target)`` (a target relative to the page, ``docs/hooks.md``), and
    ``Example::`` blocks become fenced Python."""
    text = re.sub(r"`([^`<]+?)\s+<([^>`]+)>`_", r"[\1](\2)", text)
    text = re.sub(r":\w+:`~[\w.]*?\.?(\w+)`", r"`\1`", text)
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(line.rstrip()[:-1])
            i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```python", *textwrap.dedent("\n".join(block)).splitlines(), "```", ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip()


def _unquoted(sig: inspect.Signature) -> str:
    return str(sig).replace("'", "")


def signature_line(func: Any) -> str:
    """``def name(arg: Type, ...) -> Ret`` with string annotations shown unquoted."""
    return f"def {func.__name__}{_unquoted(inspect.signature(func))}"


def default_label(field: attrs.Attribute) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()
    if attrs.has(type(default)):
        return "see below"
    try:
        return f"`{json.dumps(default)}`"
    except TypeError:
        return f"`{default!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _field_table(rows: list[tuple[str, attrs.Attribute]]) -> list[str]:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for path, f in rows:
        doc = documented_meaning(f)
        lines.append(f"| `{path}` | {_cell(type_label(f.type))} | {_cell(default_label(f))} | {_cell(doc)} |")
    return lines


def _anchor(text: str) -> str:
    """The heading id GitHub and MkDocs give ``text``."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _links(headings: Iterable[str]) -> str:
    """A Markdown list of links to the headings ``headings`` of the same page."""
    return "\n".join(f"- [`{h}`](#{_anchor(h)})" for h in headings)


def _join(sections: Iterable[list[str]]) -> str:
    """Sections given as lists of lines, one after the other."""
    return "\n".join(line for lines in sections for line in lines).strip("\n")


class _PageTemplate(string.Template):
    """``{{name}}`` placeholders: the prose has ``$`` (console prompts, ``$.train.lr``) and
    braces (YAML flow mappings) of its own. A ``{{`` that is not a placeholder is an error."""

    pattern = r"""\{\{(?:(?P<named>[a-z][\w:-]*)\}\}|(?P<braced>(?!))|(?P<escaped>(?!))|(?P<invalid>))"""


def fill(page: str, values: dict[str, str]) -> str:
    """The template of ``page`` (``docs/templates/<page>``) with its placeholders
    filled. The template must use exactly the placeholders given: one missing means
    something computed would not appear on the page (a new command, say)."""
    where = TEMPLATES_DIR / page
    source = where.relative_to(DOCS_DIR.parent).as_posix()
    values = {"notice": f"<!-- Generated by `{REGENERATE}` from {source}; do not edit by hand. -->", **values}
    template = _PageTemplate(where.read_text(encoding="utf-8"))
    used, given = set(template.get_identifiers()), set(values)
    problems = []
    if given - used:
        problems.append("add the placeholders " + ", ".join(f"{{{{{n}}}}}" for n in sorted(given - used)))
    if used - given:
        problems.append("nothing fills " + ", ".join(f"{{{{{n}}}}}" for n in sorted(used - given)))
    if problems:
        raise ValueError(f"{source}: {'; '.join(problems)}")
    return template.substitute(values).rstrip() + "\n"


# --- plugin-guide/example-package.md ------------------------------------------------

_EXAMPLE_LANGS = {".py": "python", ".toml": "toml"}
_MD_LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]*)(#[^)\s]*)?\)")


def _example_files(root: Path) -> list[Path]:
    """The package's source files, top-level ones (``pyproject.toml``) first, without what
    an install or a test run leaves there."""
    left_by_tools = ("__pycache__", "build", ".pytest_cache")
    files = [
        path
        for path in root.rglob("*")
        if path.suffix in _EXAMPLE_LANGS
        and path.is_file()
        and not any(
            part in left_by_tools or part.endswith(".egg-info") for part in path.relative_to(root).parts
        )
    ]
    return sorted(files, key=lambda path: (path.parent != root, path))


def example_markdown(root: Path = EXAMPLE_DIR, page: str = EXAMPLE_PAGE) -> str:
    """The example package as one page: its README, then every file. A link of the
    README to one of those files points at the file on this page, one into ``docs/``
    is made relative to the page, and one anywhere else (the site cannot serve it)
    keeps only its text."""
    files = _example_files(root)
    headings = {path: f"`{path.relative_to(root).as_posix()}`" for path in files}
    page_dir = (DOCS_DIR / page).parent

    def relink(m: re.Match) -> str:
        text, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if not target or "://" in target or target.startswith("mailto:"):
            return m.group(0)
        resolved = (root / target).resolve()
        if resolved in headings:
            return f"[{text}](#{_anchor(headings[resolved])})"
        if resolved.is_relative_to(DOCS_DIR):
            return f"[{text}]({os.path.relpath(resolved, page_dir)}{anchor})"
        return text

    readme = _MD_LINK.sub(relink, (root / "README.md").read_text(encoding="utf-8")).strip()
    title, _, body = readme.partition("\n")
    sections = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`{3,}", text))])
        lang = _EXAMPLE_LANGS[path.suffix]
        sections.append([f"### {headings[path]}", "", f"{fence}{lang}", text.rstrip("\n"), fence, ""])
    return fill(
        page,
        {
            "title": title,
            "path": root.relative_to(DOCS_DIR.parent).as_posix(),
            "readme": body.strip(),
            "files": _join(sections),
        },
    )


# --- hooks.md -----------------------------------------------------------------------


def hook_objects() -> tuple[str, ...]:
    """Objects a plugin author builds, receives or returns, as import paths; their fields
    are listed in hooks.md. The spec classes come from the kinds of component."""
    from forge_core.kinds import KINDS

    specs = [f"forge_core.api:{kind.spec_cls.__name__}" for kind in KINDS]
    others = (
        "NoOptions",
        "RowLayout",
        "Rule",
        "Plan",
        "ActiveStrategy",
        "ChosenSource",
        "RunContext",
        "NamedParameter",
        "ParallelContext",
        "MeshDim",
        "AttentionContext",
        "Strategy",
        "ModelFacts",
        "ParallelContract",
        "PipelineSplit",
        "TensorParallelPlan",
        "TensorParallelScope",
        "Model",
        "ParallelModule",
        "PretrainedModel",
        "CachingModel",
    )
    return ("forge_core.api:ComponentSpec", *specs, *(f"forge_core.api:{name}" for name in others))


def hookspec_functions() -> list[Any]:
    """Every hookspec, registration hooks first, each group in source order."""
    from forge_core import hookspecs
    from forge_core.api.hooks import PROJECT

    marker = f"{PROJECT}_spec"
    found = [
        obj
        for name, obj in vars(hookspecs).items()
        if name.startswith("forge_") and callable(obj) and hasattr(obj, marker)
    ]
    return sorted(found, key=lambda f: f.__code__.co_firstlineno)


def _python_default(field: attrs.Attribute) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return f"`{default.factory.__name__}()`"
    if isinstance(default, type):
        return f"`{default.__name__}`"
    return f"`{default!r}`"


def _object_section(path: str) -> list[str]:
    from forge_core.api import import_path

    cls = import_path(path)
    module, _, name = path.partition(":")
    lines = [f"### `{name}`", "", f"`from {module} import {name}`", ""]
    doc = inspect.getdoc(cls)
    if doc:
        lines += [rst_to_markdown(doc), ""]
    fields = attrs.fields(cls) if attrs.has(cls) else ()  # a protocol has methods only
    if fields:
        # Python API: annotations as written in the source, defaults as Python values.
        lines += ["| field | type | default |", "| --- | --- | --- |"]
        for f in fields:
            tp = annotation_as_written(cls, f.name)
            alias = vars(sys.modules[cls.__module__]).get(tp)
            if typing.get_origin(alias) is typing.Literal:
                tp = " | ".join(repr(a) for a in typing.get_args(alias))
            lines.append(f"| `{f.name}` | `{_cell(tp)}` | {_cell(_python_default(f))} |")
        lines.append("")
    members = [
        (name, value)
        for name, value in vars(cls).items()
        if not name.startswith("_")
        and (callable(value) or isinstance(value, property))
        and name not in {f.name for f in fields}
    ]
    if members:
        lines += ["Methods and properties:", ""]
        for name, value in members:
            shown = name if isinstance(value, property) else f"{name}{_unquoted(inspect.signature(value))}"
            doc = (inspect.getdoc(value) or "").strip()
            summary = f": {rst_to_markdown(doc.splitlines()[0])}" if doc else ""
            lines.append(f"- `{shown.replace('(self, ', '(').replace('(self)', '()')}`{summary}")
        lines.append("")
    kind = getattr(cls, "kind", None)
    if isinstance(kind, str) and kind != "component":
        lines += [f"Kind name: `{kind}` (as `forge-run plugins --json` reports it).", ""]
    return lines


def _defined_in(name: str) -> tuple[Any, list[str], int]:
    """The submodule of ``forge_core.api`` that defines ``name`` (a ``class``, a ``def`` or
    an assignment at its top level), its source lines and the line that defines it."""
    import importlib
    import pkgutil

    import forge_core.api as api

    for info in pkgutil.iter_modules(api.__path__):
        module = importlib.import_module(f"forge_core.api.{info.name}")
        if vars(module).get(name) is not getattr(api, name):
            continue  # another object of that name (``optim.ROLES`` beside ``transforms.ROLES``)
        lines = inspect.getsource(module).splitlines()
        for i, line in enumerate(lines):
            if re.match(rf"(class |def ){name}\b|{name}\s*[:=]", line):
                return module, lines, i
    raise LookupError(f"forge_core.api.{name} is defined in no submodule of forge_core.api")


def facade_rows() -> list[tuple[str, str, str]]:
    """``(name, defining module, one-line summary)`` for every stable name of
    ``forge_core.api``: a constant's ``#:`` comment (as Sphinx reads it), else the first
    paragraph of its docstring (empty when it has neither)."""
    import forge_core.api as api

    rows = []
    for name in api.__all__:
        module, lines, i = _defined_in(name)
        above = []
        while i > 0 and lines[i - 1].startswith("#:"):
            i -= 1
            above.insert(0, lines[i][2:].strip())
        summary = " ".join(above)
        obj = getattr(api, name)
        if not summary and (inspect.isclass(obj) or inspect.isfunction(obj)):
            summary = (inspect.getdoc(obj) or "").split("\n\n")[0]
        rows.append((name, module.__name__, " ".join(summary.split())))
    return rows


def _facade_table() -> str:
    lines = ["| name | defined in | what it is |", "| --- | --- | --- |"]
    for name, module, summary in sorted(facade_rows(), key=lambda row: (row[1], row[0].lower())):
        lines.append(f"| `{name}` | `{module}` | {_cell(rst_to_markdown(summary))} |")
    return "\n".join(lines)


def hooks_markdown() -> str:
    from forge_core import hookspecs
    from forge_core.api.hooks import PROJECT

    funcs = hookspec_functions()
    lifecycle_prefixes = ("forge_train_", "forge_step_", "forge_eval_", "forge_checkpoint_")
    registration = [f for f in funcs if not f.__name__.startswith(lifecycle_prefixes)]
    lifecycle = [f for f in funcs if f.__name__.startswith(lifecycle_prefixes)]
    return fill(
        "hooks.md",
        {
            "project": PROJECT,
            "hookspecs_doc": rst_to_markdown(inspect.getdoc(hookspecs) or ""),
            "registration_index": _links(f.__name__ for f in registration),
            "lifecycle_index": _links(f.__name__ for f in lifecycle),
            "registration_hooks": _join(_hook_section(f) for f in registration),
            "lifecycle_hooks": _join(_hook_section(f) for f in lifecycle),
            "objects": _join(_object_section(path) for path in hook_objects()),
            "facade": _facade_table(),
        },
    )


def _hook_section(func: Any) -> list[str]:
    return [
        f"### `{func.__name__}`",
        "",
        "```python",
        "@hookspec",
        signature_line(func) + ": ...",
        "```",
        "",
        rst_to_markdown(inspect.getdoc(func) or ""),
        "",
    ]


# --- configuration.md ---------------------------------------------------------------


def _walk(cls: type, prefix: str) -> Iterator[tuple[str, attrs.Attribute]]:
    for f in resolved_fields(cls):
        if not _is_degrees(cls, f):
            yield f"{prefix}{option_key(f)}", f


def _is_degrees(cls: type, f: attrs.Attribute) -> bool:
    """The ``parallel`` section's degrees: filled by the loader from keys the strategies
    declare (documented by :func:`degree_rows`), never written as ``degrees``."""
    return f.name == "degrees" and hasattr(cls, "split_raw")


def degree_rows(registries: Registries) -> list[str]:
    """Table rows of the ``parallel.<dim>`` degrees the registered strategies declare."""
    from forge_core.parallel_dims import mesh_dims

    registry = registries["parallelism"]
    owner = {registry.get(n).dim.name: n for n in registry.names() if registry.get(n).dim is not None}
    rows = []
    for dim in mesh_dims(registry):
        allowed = "at least 1, or -1" if dim.fills_world else "at least 1"
        meaning = f"{dim.summary} Allowed: {allowed}. Declared by the strategy `{owner[dim.name]}`."
        rows.append(f"| `parallel.{dim.name}` | `int` | `{dim.default}` | {_cell(meaning)} |")
    return rows


def _list_item_class(tp: Any) -> type | None:
    """``X`` for a field of type ``list[X]`` where ``X`` is an attrs class."""
    args = typing.get_args(tp) if typing.get_origin(tp) is list else ()
    return args[0] if len(args) == 1 and isinstance(args[0], type) and attrs.has(args[0]) else None


def config_keys() -> list[str]:
    """Every key path of the schema, sections recursively (``train.nonfinite.policy``;
    the keys of a list's entries as ``data.sources[].name``)."""
    from forge_core.config.schema import ForgeConfig

    out: list[str] = []

    def visit(cls: type, prefix: str) -> None:
        for f in resolved_fields(cls):
            if _is_degrees(cls, f):
                continue
            out.append(prefix + option_key(f))
            if _list_item_class(f.type) is not None:
                visit(_list_item_class(f.type), f"{prefix}{f.name}[].")
            elif _section_type(f.type) is not None:
                visit(_section_type(f.type), f"{prefix}{f.name}.")

    visit(ForgeConfig, "")
    return out


def _section_type(tp: Any) -> type | None:
    """The attrs class a field holds (itself, or inside ``X | None``), else ``None``."""
    for candidate in (tp, *typing.get_args(tp)):
        if isinstance(candidate, type) and attrs.has(candidate):
            return candidate
    return None


def option_rows(cls: type, prefix: str) -> list[tuple[str, attrs.Attribute]]:
    """``(path, field)`` for every option of ``cls``, nested option sections included
    (``model.options.rope_scaling.factor``)."""
    rows = []
    for f in resolved_fields(cls):
        rows.append((prefix + option_key(f), f))
        section = _section_type(f.type)
        if section is not None:
            rows += option_rows(section, f"{prefix}{f.name}.")
    return rows


def _options_prefix(kind: Any, name: str) -> str:
    """Where the options of the component ``name`` of ``kind`` sit in a config."""
    return f"{kind.options_path}.{name}." if kind.keyed else f"{kind.options_path}."


def component_option_keys(registries: Registries) -> list[str]:
    """The option keys of every built-in component, as config paths, and the degree
    keys (``parallel.<dim>``) of the mesh dimensions the strategies declare."""
    from forge_core.kinds import KINDS
    from forge_core.parallel_dims import mesh_dims

    return [
        *(f"parallel.{dim.name}" for dim in mesh_dims(registries["parallelism"])),
        *(
            path
            for kind in KINDS
            for name in registries[kind.name].names()
            for path, _ in option_rows(registries[kind.name].get(name).options, _options_prefix(kind, name))
        ),
    ]


def _component_tables(registries: Registries, kind: Any) -> list[str]:
    registry = registries[kind.name]
    lines = []
    for name in registry.names():
        spec = registry.get(name)
        heading = f"`{kind.options_path}.{name}`" if kind.keyed else f"`{kind.name_path}: {name}`"
        lines += [f"#### {heading}", "", spec.summary.rstrip(".") + ".", ""]
        if not resolved_fields(spec.options):
            lines += ["No options.", ""]
            continue
        lines += [*_field_table(option_rows(spec.options, _options_prefix(kind, name))), ""]
    return lines


def config_markdown(registries: Registries) -> str:
    from forge_core.api.errors import VALUE_WIDTH
    from forge_core.config.errors import MAX_REPORTED
    from forge_core.config.overrides import MOVED_KEYS
    from forge_core.config.schema import ForgeConfig
    from forge_core.config.structuring import MAX_UNKNOWN_SHOWN
    from forge_core.config.yaml_reader import MAX_DEPTH, MAX_NODES
    from forge_core.kinds import KINDS

    option_blocks = {kind.options_path: kind for kind in KINDS}
    sections = resolved_fields(ForgeConfig)
    lines: list[str] = []
    for section in sections:
        lines += [f"## `{section.name}`", "", option_doc(section), ""]
        table = _field_table(list(_walk(section.type, f"{section.name}.")))
        if section.name == "parallel":
            table[2:2] = degree_rows(registries)
        lines += [*table, ""]
        for path, f in _walk(section.type, f"{section.name}."):
            if isinstance(f.type, type) and attrs.has(f.type):
                lines += [f"### `{path}`", "", option_doc(f), ""]
                lines += [*_field_table(list(_walk(f.type, f"{path}."))), ""]
            elif _list_item_class(f.type) is not None:
                lines += [f"### `{path}[]`", "", f"Each entry of `{path}`: {option_doc(f)}", ""]
                lines += [*_field_table(list(_walk(_list_item_class(f.type), f"{path}[]."))), ""]
            elif path in option_blocks:
                kind = option_blocks[path]
                if kind.keyed:
                    intro = [
                        f"A mapping from {kind.label} name to that {kind.label}'s options, for example",
                        f"`{path}.<name>.<option>`. For the built-in ones:",
                    ]
                else:
                    intro = [
                        f"Options of the component named by `{kind.name_path}`; the keys depend",
                        "on which one is chosen. For the built-in ones:",
                    ]
                lines += [f"### `{path}`", "", *intro, "", *_component_tables(registries, kind)]
    return fill(
        "configuration.md",
        {
            "max_nodes": f"{MAX_NODES:,}",
            "max_depth": str(MAX_DEPTH),
            "max_reported": str(MAX_REPORTED),
            "unknown_shown": str(MAX_UNKNOWN_SHOWN),
            "width": str(VALUE_WIDTH),
            "section_index": "\n".join(
                f"- [`{f.name}`](#{_anchor(f.name)}): {option_doc(f)}" for f in sections
            ),
            "sections": _join([lines]),
            "moved_keys": "\n".join(
                [
                    "| old key | new key |",
                    "| --- | --- |",
                    *[f"| `{old}` | `{new}` |" for old, new in MOVED_KEYS.items()],
                ]
            ),
        },
    )


# --- cli.md -------------------------------------------------------------------------


def _help_text(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=HELP_WIDTH)
    return parser.format_help().rstrip()


def cli_markdown() -> str:
    parser = build_parser()
    commands = subcommands(parser)
    return fill(
        "cli.md",
        {
            "help": _help_text(parser),
            "command_index": _links(f"forge-run {name}" for name in commands),
            **{f"help:{name}": _help_text(sub) for name, sub in commands.items()},
        },
    )


# --- coming-from.md -----------------------------------------------------------------


def coming_from_markdown() -> str:
    """The other trainers' tables, from :data:`forge_core.config.foreign_keys.TRAINERS`,
    which the unknown-key and unknown-flag errors read too."""
    from forge_core.config.foreign_keys import TRAINERS

    return fill("coming-from.md", {f"table:{name}": trainer.table() for name, trainer in TRAINERS.items()})


# --- all pages ----------------------------------------------------------------------


def generated_pages() -> dict[str, str]:
    """Every generated page, by path relative to ``docs/``."""
    from forge_core.reference import components_markdown, rules_markdown

    registries = builtin_registries()
    return {
        "hooks.md": hooks_markdown(),
        "configuration.md": config_markdown(registries),
        "cli.md": cli_markdown(),
        "coming-from.md": coming_from_markdown(),
        "reference/components.md": components_markdown(registries),
        "reference/rules.md": rules_markdown(registries),
        EXAMPLE_PAGE: example_markdown(),
    }


def stale_pages(docs_dir: Path = DOCS_DIR) -> list[str]:
    """Generated pages whose committed text differs from what the code produces now."""
    stale = []
    for rel, text in generated_pages().items():
        path = docs_dir / rel
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(rel)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list stale pages and exit 1 if any")
    parser.add_argument("--docs", type=Path, default=DOCS_DIR, help="docs directory (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.docs)
        for rel in stale:
            print(f"stale: docs/{rel} (run `{REGENERATE}`)")
        return 1 if stale else 0
    for rel, text in generated_pages().items():
        path = args.docs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote docs/{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
