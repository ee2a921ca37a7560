"""Read a config file's YAML, refusing what a config never needs and an attacker could
use: deep nesting, alias bombs, duplicate keys, keys that are not strings."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Any

import yaml

from forge_core.api.unstable import show_value
from forge_core.config.errors import ConfigError, type_name

#: Deepest nesting of mappings and lists a config may have (a config is a few levels
#: of sections and options); deeper input is refused before it is built.
MAX_DEPTH = 64
#: Most values (scalars, lists, mappings) a config may expand to, counting what every
#: alias (``*name``) repeats: a few hundred bytes of aliases can otherwise expand to
#: billions of values.
MAX_NODES = 100_000

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TAG_NAMES = {
    "tag:yaml.org,2002:int": "an integer",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:bool": "a boolean",
    "tag:yaml.org,2002:null": "null",
}


class _TooMany(Exception):
    """More than :data:`MAX_NODES` distinct values composed: reading stops there."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``3e-4`` as a float (YAML 1.2), not a string (YAML 1.1),
    and, while composing, refuses nesting deeper than :data:`MAX_DEPTH` (PyYAML's
    composer recurses once per level) and stops after :data:`MAX_NODES` values (so a
    huge file costs no more than a config may hold)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        self._composed += 1
        if self._composed > MAX_NODES:
            raise _TooMany
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _ScalarResolver(yaml.resolver.Resolver):
    """The tags :class:`_Loader` gives plain scalars, for :func:`_plain_scalar`."""


for _resolver in (_Loader, _ScalarResolver):
    _resolver.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )

#: Text that YAML reads as one plain scalar, whatever it holds: no space, quote, flow or
#: comment indicator, alias, tag or ``:``, and ending in a letter or digit (so not ``-``,
#: ``---`` or ``...``). Most override values (``3e-4``, ``true``, ``bf16``) are such text.
_PLAIN = re.compile(r"[A-Za-z0-9_.+-]*[A-Za-z0-9_]\Z")
_SCALAR_TAGS = _ScalarResolver()


def _plain_scalar(text: str) -> Any:
    """``text`` read as the one plain scalar it is: the tag the loader's resolver gives
    it, built by the safe constructor. What parsing it would return, without a parser
    per override (100,000 overrides cost seconds of parser start-up otherwise)."""
    tag = _SCALAR_TAGS.resolve(yaml.ScalarNode, text, (True, False))
    return yaml.constructor.SafeConstructor().construct_object(yaml.ScalarNode(tag, text))


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _expanded_size(root: yaml.Node) -> int | None:
    """How many values the document builds, aliases expanded; ``None`` for an alias
    that contains itself. Linear in the number of distinct nodes (each is sized once)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int | None:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            return None
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            return 1
        open_nodes.add(key)
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
        total = 1
        for child in children:
            part = size(child)  # recursion bounded by MAX_DEPTH
            if part is None:
                return None
            total += part
        open_nodes.discard(key)
        sizes[key] = total
        return total

    return size(root)


def _key_problems(root: yaml.Node, where: str) -> list[tuple[str, str]]:
    """Duplicate keys (with both lines) and keys that are not strings, each at the path
    of its mapping. Every distinct node is visited once."""
    issues: list[tuple[str, str]] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, where)]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes or isinstance(node, yaml.ScalarNode):
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(reversed([(child, f"{path}[{i}]") for i, child in enumerate(node.value)]))
            continue
        first_line: dict[str, int] = {}
        children: list[tuple[yaml.Node, str]] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                children.append((value_node, path))
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                at = f"(line {_line(key_node)})"
                if isinstance(key_node, yaml.ScalarNode):
                    kind = _TAG_NAMES.get(key_node.tag, "a " + key_node.tag.rpartition(":")[2])
                    text = key_node.value if len(key_node.value) <= 40 else key_node.value[:37] + "..."
                    problem = (
                        f"key {text or '(empty)'} {at} is {kind}, not a string: config keys "
                        f'are names; quote it ("{text}") if it is one'
                    )
                else:
                    problem = f"a key {at} is a list or mapping: config keys are names"
                issues.append((path, problem))
                continue
            key = key_node.value
            if key in first_line:
                issues.append(
                    (
                        path,
                        (
                            f"key {show_value(key)} is given twice (lines {first_line[key]} and "
                            f"{_line(key_node)}): the second would silently replace the first; "
                            "merge them into one"
                        ),
                    )
                )
                continue
            first_line[key] = _line(key_node)
            children.append((value_node, f"{path}.{key}"))
        stack.extend(reversed(children))
    return issues


def _position(text: str, index: int) -> str:
    """``line L, column C`` of the character at ``index`` of ``text`` (both from 1)."""
    line, line_start = text.count("\n", 0, index) + 1, text.rfind("\n", 0, index) + 1
    return f"line {line}, column {index - line_start + 1}"


def _unprintable(text: str, exc: yaml.reader.ReaderError, of: str) -> str:
    """What PyYAML's reader refused: a character YAML allows nowhere, not even in quotes
    (NUL and the other control characters but tab and line breaks; a lone surrogate,
    which an undecodable byte of a command-line argument becomes)."""
    char = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
    kind = "a control character" if unicodedata.category(char) == "Cc" else "not a character"
    damaged = " (is the file binary or damaged?)" if of else ""
    return (
        f"invalid YAML ({_position(text, exc.position)}{of}): {char!r} (U+{ord(char):04X}) is "
        f"{kind}, which YAML does not allow anywhere: remove it{damaged}"
    )


def parse_yaml(text: str, where: str, source: str = "") -> Any:
    """Parse one YAML document of config data, refusing what a config never needs and
    an attacker could use: nesting deeper than :data:`MAX_DEPTH`, more than
    :data:`MAX_NODES` values once aliases are expanded, an alias inside itself,
    duplicate keys and keys that are not strings. Anchors and aliases within those
    bounds are accepted (``defaults: &d {...}`` then ``<<: *d``). ``source`` (a file
    name) is named in the message of a syntax error."""
    of, in_file = (f" of {source!r}", f" (in {source!r})") if source else ("", "")
    if _PLAIN.match(text):
        try:
            return _plain_scalar(text)
        except ValueError as exc:  # int() of a number beyond Python's digit limit
            raise ConfigError([(where, f"invalid YAML{in_file}: {exc}")]) from None
    try:
        loader = _Loader(text)  # the reader refuses control characters here, before parsing
    except yaml.reader.ReaderError as exc:
        raise ConfigError([(where, _unprintable(text, exc, of))]) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node)
        if size is None:
            raise ConfigError(
                [(where, "an alias (*name) refers to a value that contains it; a config cannot be infinite")]
            )
        if size > MAX_NODES:
            raise ConfigError(
                [
                    (
                        where,
                        (
                            f"the YAML expands to {size:,} values, more than the {MAX_NODES:,} a config may "
                            "have (anchors and aliases, &name and *name, repeat what they name): write the "
                            "values out"
                        ),
                    )
                ]
            )
        issues = _key_problems(node, where)
        if issues:
            raise ConfigError(issues)
        return loader.construct_document(node)
    except _TooMany:
        right_file = f": is {source!r} the right file?" if source else ""
        too_many = f"the YAML holds more than the {MAX_NODES:,} values a config may have{right_file}"
        raise ConfigError([(where, too_many)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1}{of})" if mark else in_file
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([(where, f"invalid YAML{at}: {problem}")]) from None
    except ValueError as exc:  # int() of a number beyond Python's digit limit
        raise ConfigError([(where, f"invalid YAML{in_file}: {exc}")]) from None
    finally:
        loader.dispose()


def _config_file_problem(path: Path) -> str | None:
    if path.is_dir():
        yamls = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        holds = f"; it holds {', '.join(yamls[:5])}{' ...' if len(yamls) > 5 else ''}" if yamls else ""
        return f"config path {str(path)!r} is a directory, not a YAML file{holds}"
    if not path.exists():
        return f"config file {str(path)!r} does not exist"
    if not path.is_file():
        return f"config path {str(path)!r} is not a regular file"
    return None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The config file as a mapping. An empty file (or one of comments only) is refused:
    it is far more often a truncated or wrong file than a wish for every default, which
    ``{}`` states explicitly."""
    path = Path(path)
    problem = _config_file_problem(path)
    if problem:
        raise ConfigError([("$", problem)])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([("$", f"cannot read {str(path)!r}: {exc}")]) from None
    raw = parse_yaml(text, "$", str(path))
    if raw is None:
        raise ConfigError(
            [
                (
                    "$",
                    (
                        f"config file {str(path)!r} is empty: write `{{}}` to train with every default, "
                        "or start from configs/quickstart.yaml"
                    ),
                )
            ]
        )
    if not isinstance(raw, dict):
        raise ConfigError([("$", f"the config must be a mapping of sections, got {type_name(raw)}")])
    return raw
