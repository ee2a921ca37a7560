"""Load a config: YAML, dotted overrides, strict structuring, component option blocks.

Every problem found is collected into one :class:`ConfigError` whose lines each start
with the config path (``$.train.lr``), so a user fixes everything in one pass.
"""

from __future__ import annotations

import math
import re
import typing
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml

from forge_core.api import INT_MAX, INT_MIN, ForgeError, did_you_mean, show_value, unknown_name
from forge_core.api.errors import VALUE_WIDTH
from forge_core.config.foreign_keys import unknown_key_hint
from forge_core.config.schema import KEYED_BLOCKS, OPTION_BLOCKS, ForgeConfig, PluginsSection


class ConfigError(ForgeError):
    """Every problem found in a config, one ``(path, message)`` per line."""

    def __init__(self, issues: list[tuple[str, str]]):
        self.issues = issues
        super().__init__("\n".join(f"error: {path}: {message}" for path, message in issues))


# --- YAML -------------------------------------------------------------------------

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


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``3e-4`` as a float (YAML 1.2), not a string (YAML 1.1),
    and refuses nesting deeper than :data:`MAX_DEPTH` while composing (PyYAML's
    composer recurses once per level)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


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


def parse_yaml(text: str, where: str) -> Any:
    """Parse one YAML document of config data, refusing what a config never needs and
    an attacker could use: nesting deeper than :data:`MAX_DEPTH`, more than
    :data:`MAX_NODES` values once aliases are expanded, an alias inside itself,
    duplicate keys and keys that are not strings. Anchors and aliases within those
    bounds are accepted (``defaults: &d {...}`` then ``<<: *d``)."""
    loader = _Loader(text)
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
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([(where, f"invalid YAML{at}: {problem}")]) from None
    except ValueError as exc:  # int() of a number beyond Python's digit limit
        raise ConfigError([(where, f"invalid YAML: {exc}")]) from None
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
    raw = parse_yaml(text, "$")
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
        raise ConfigError([("$", f"the config must be a mapping of sections, got {_type_name(raw)}")])
    return raw


def _plain_copy(value: Any) -> Any:
    """A copy sharing nothing (an alias makes two places hold one object, and an override
    of one must not change the other). Depth is bounded by :data:`MAX_DEPTH`."""
    if isinstance(value, dict):
        return {k: _plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_copy(v) for v in value]
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a copy of ``raw``."""
    result, issues = _overridden(raw, overrides)
    if issues:
        raise ConfigError(issues)
    return result


def _overridden(raw: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``raw`` with every valid override applied, and the problems of the others."""
    result = _plain_copy(raw)
    issues = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            issues.append(("$", f"override {show_value(item)} is not of the form section.key=value"))
            continue
        parts = key.split(".")
        if len(parts) > MAX_DEPTH:
            issues.append(
                ("$", f"override key {show_value(key)} is nested more than {MAX_DEPTH} levels deep")
            )
            continue
        try:
            value = parse_yaml(text, f"$.{key}")
        except ConfigError as exc:
            issues.extend(exc.issues)
            continue
        target = result
        for depth, part in enumerate(parts[:-1]):
            nxt = target.setdefault(part, {})
            if nxt is None:
                nxt = target[part] = {}
            if not isinstance(nxt, dict):
                where = "$." + ".".join(parts[: depth + 1])
                issues.append(
                    (where, f"override {show_value(item)} goes inside {where}, which is not a mapping")
                )
                break
            target = nxt
        else:
            target[parts[-1]] = value
    return result, issues


#: Config keys that moved, old path -> new path. An old key (in a file or an override) is
#: an error at its path naming the new one, reported with every other problem.
MOVED_KEYS: dict[str, str] = {
    # Strategy settings moved into the strategy's own option block.
    "parallel.pp_schedule": "parallel.options.pp.schedule",
    "parallel.pp_microbatches": "parallel.options.pp.microbatches",
    "parallel.pp_virtual_stages": "parallel.options.pp.virtual_stages",
    "parallel.sequence_parallel": "parallel.options.tp.sequence_parallel",
}


def _moved_key_issues(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Take every moved key out of ``raw`` (so it is not also reported as unknown) and
    say where it went."""
    issues = []
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        block = raw.get(section)
        if isinstance(block, dict) and key in block:
            value = block.pop(key)
            issues.append(
                (
                    f"$.{old}",
                    f"moved to {new}: set {new} = {show_value(value)} instead "
                    f"(override: {new}={show_value(value)})",
                )
            )
    return issues


def migrate_moved_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with every moved key put at its new path (where that is not set already):
    for configs Forge itself wrote (a run directory's ``config.yaml``), never for a
    user's, whose old keys are errors that name the new path."""
    raw = _plain_copy(raw)
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        block = raw.get(section)
        if not isinstance(block, dict) or key not in block:
            continue
        value = block.pop(key)
        *parents, leaf = new.split(".")
        target = raw
        for part in parents:
            if target.get(part) is None:
                target[part] = {}
            if not isinstance(target[part], dict):
                break  # the new place is not a mapping: structuring reports it
            target = target[part]
        else:
            target.setdefault(leaf, value)
    return raw


def read_raw(path: str | Path, overrides: list[str] = ()) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The config file with the valid overrides applied, as plain data (not yet
    structured), and the problems of the other overrides and of moved keys (reported
    with the rest)."""
    raw, issues = _overridden(read_config_file(path), list(overrides))
    return raw, issues + _moved_key_issues(raw)


# --- strict structuring -------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class ScalarError(TypeError):
    pass


def _strict_int(value: Any, _: type) -> int:
    if type(value) is int:
        if INT_MIN <= value <= INT_MAX:
            return value
        raise ScalarError(f"expected an integer from -2**63 to 2**63-1, got {show_value(value)}")
    raise ScalarError(f"expected an integer, got {show_value(value)} ({_type_name(value)})")


def _strict_float(value: Any, _: type) -> float:
    if type(value) in (int, float):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isfinite(number):
            return number
        raise ScalarError(f"expected a finite number, got {show_value(value)}")
    raise ScalarError(f"expected a number, got {show_value(value)} ({_type_name(value)})")


def _strict_str(value: Any, _: type) -> str:
    if type(value) is str:
        return value
    raise ScalarError(f"expected a string, got {show_value(value)} ({_type_name(value)})")


def _strict_bool(value: Any, _: type) -> bool:
    if type(value) is bool:
        return value
    raise ScalarError(f"expected true or false, got {show_value(value)} ({_type_name(value)})")


def _mapping(value: Any, _: type) -> dict:
    if isinstance(value, dict):
        return dict(value)
    raise ScalarError(f"expected a mapping, got {show_value(value)} ({_type_name(value)})")


def _strict_list(value: Any, cl: type) -> list:
    if not isinstance(value, list):
        raise ScalarError(f"expected a list, got {show_value(value)} ({_type_name(value)})")
    (item_type,) = typing.get_args(cl) or (Any,)
    out, errors = [], []
    for i, item in enumerate(value):
        try:
            out.append(converter.structure(item, item_type))
        except Exception as exc:  # noqa: BLE001 - collected, every item reported at its index
            exc.__notes__ = [
                *getattr(exc, "__notes__", []),
                cattrs.errors.IterableValidationNote(f"Structuring {cl} @ index {i}", i, item_type),
            ]
            errors.append(exc)
    if errors:
        raise cattrs.errors.IterableValidationError(f"While structuring {cl!r}", errors, cl)
    return out


class FieldValidatorError(ValueError):
    """An attrs validator of one field refused its value (the message is the validator's)."""


def _field_validator_errors(instance: Any, cl: type) -> list[Exception]:
    """Run every field validator of ``cl`` on ``instance`` (built with validators off) and
    return their errors, each noted with its field so that its path ends in the field."""
    errors: list[Exception] = []
    for field in attrs.fields(cl):
        if field.validator is None:
            continue
        try:
            field.validator(instance, field, getattr(instance, field.name))
        except Exception as exc:  # a validator may raise anything; report it, don't crash
            # attrs' own validators raise with (message, attribute, ...) as args.
            message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
            error = FieldValidatorError(message)
            error.__notes__ = [
                cattrs.errors.AttributeValidationNote(
                    f"Validating class {cl.__qualname__} @ attribute {field.name}", field.name, field.type
                )
            ]
            errors.append(error)
    return errors


def _attrs_structure_factory(conv: cattrs.Converter):
    """The default attrs hook, except that when the constructor fails because of field
    validators, every failing field is reported at its own path (``$.attention.options.window``)
    rather than the first one at the class's path. attrs runs validators inside
    ``__init__`` and stops at the first, so they are rerun one by one on an instance
    built with validators disabled."""

    def factory(cl: type) -> Any:
        base = cattrs.gen.make_dict_structure_fn(cl, conv)

        def structure_attrs(value: Any, _: type) -> Any:
            try:
                return base(value, cl)
            except cattrs.errors.ClassValidationError as exc:
                located, unlocated = exc.group_exceptions()
                if located or any(isinstance(e, cattrs.ForbiddenExtraKeysError) for e in unlocated):
                    raise  # structuring errors of fields or keys, already located
                # Every field structured, so the class's __init__ raised: a field
                # validator or __attrs_post_init__.
                try:
                    # A global switch, but configs are loaded before any other thread
                    # builds attrs instances; the context restores it whatever happens.
                    with attrs.validators.disabled():
                        instance = base(value, cl)
                except Exception:
                    raise exc from None  # __attrs_post_init__: stays at the class's path
                errors = _field_validator_errors(instance, cl)
                if not errors:
                    raise
                raise cattrs.errors.ClassValidationError(
                    f"While validating {cl.__qualname__}", errors, cl
                ) from None

        return structure_attrs

    return factory


def make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook_factory(attrs.has, _attrs_structure_factory(conv))
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is dict or t is dict, _mapping)
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is list, _strict_list)
    return conv


converter = make_converter()


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        known = [a.name for a in attrs.fields(exc.cl)]
        parts = [
            f"unknown key {show_value(key)}.{did_you_mean(str(key), known)}"
            f"{unknown_key_hint(exc.cl, str(key))} Keys here: {', '.join(known)}"
            for key in sorted(exc.extra_fields, key=str)
        ]
        return "; ".join(parts)
    if isinstance(exc, KeyError):
        return f"required key {show_value(exc.args[0])} is missing"
    if isinstance(exc, (ScalarError, FieldValidatorError)):
        return str(exc)
    if typing.get_origin(type_) is typing.Literal:
        choices = typing.get_args(type_)
        value = exc.args[0] if exc.args else "?"
        match = re.match(r"(.*) not in literal", str(value), re.S)
        got = _clip(str(match.group(1) if match else value))
        return (
            f"expected one of {', '.join(map(repr, choices))}, got {got}."
            f"{did_you_mean(got, map(str, choices))}"
        )
    if attrs.has(type_):
        return f"expected a mapping, got something else ({_clip(str(exc))})"
    return _clip(f"{type(exc).__name__}: {exc}", 300)


def _clip(text: str, width: int = VALUE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def structure(raw: Any, cls: type, root: str = "$") -> tuple[Any, list[tuple[str, str]]]:
    """Structure ``raw`` into ``cls``; returns ``(instance or None, issues)``."""
    if not isinstance(raw, dict):
        return None, [(root, f"expected a mapping, got {show_value(raw)} ({_type_name(raw)})")]
    try:
        return converter.structure(raw, cls), []
    except Exception as exc:  # cattrs raises ClassValidationError groups
        lines = cattrs.transform_error(exc, path=root, format_exception=_format_exception)
        issues = []
        for line in lines:
            message, _, path = line.rpartition(" @ ")
            issues.append((path or root, message or line))
        return None, issues


# --- component option blocks ---------------------------------------------------------

#: A value a block lookup cannot use (its section is not a mapping); the section's own
#: structuring reports why.
_UNUSABLE = object()


def _schema_default(path: str) -> Any:
    section, key = path.split(".")
    field = attrs.fields_dict(attrs.fields_dict(ForgeConfig)[section].type)[key]
    default = field.default
    return default.factory() if isinstance(default, attrs.Factory) else default  # type: ignore[arg-type]


def _raw_lookup(raw: dict[str, Any]):
    """Read ``section.key`` from unstructured config data, with the schema's default."""

    def lookup(path: str) -> Any:
        section, key = path.split(".")
        value = raw.get(section, {})
        if not isinstance(value, dict):
            return _UNUSABLE
        return value[key] if key in value else _schema_default(path)

    return lookup


def _resolved(spec: Any, options: Any, where: str) -> tuple[Any, list[tuple[str, str]]]:
    """``options`` completed by the spec's ``resolve_options`` function (options the
    config left unset, filled from elsewhere: a checkpoint's config)."""
    from forge_core.api import import_path

    try:
        return import_path(spec.resolve_options)(options), []
    except Exception as exc:  # a plugin's bug must not read as a traceback of the loader
        return options, [
            (
                where,
                f"{spec.kind} {spec.name!r}: resolve_options {spec.resolve_options!r} "
                f"failed ({type(exc).__name__}: {exc})",
            )
        ]


def _structure_blocks(lookup: Any, registries: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Check every component name and structure its option block against its spec's
    options class, as far as the name is known. Returns ``{options_path: value}``."""
    issues: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    for block in OPTION_BLOCKS:
        registry = registries[block.name]
        name = lookup(block.name_path)
        if not isinstance(name, str):
            continue  # not a name: the schema reports it
        if name not in registry:
            issues.append((f"$.{block.name_path}", registry.refusal(name)))
            continue
        options = lookup(block.options_path)
        if options is _UNUSABLE:
            continue
        spec = registry.get(name)
        value, problems = structure(options, spec.options, f"$.{block.options_path}")
        issues.extend(problems)
        if value is not None and getattr(spec, "resolve_options", None):
            value, problems = _resolved(spec, value, f"$.{block.options_path}")
            issues.extend(problems)
        values[block.options_path] = value
    issues += _structure_source_entries(lookup, registries["source"], values)
    issues += _structure_eval_source(lookup, registries["source"], values)
    for block in KEYED_BLOCKS:
        registry = registries[block.name]
        names = lookup(block.name_path)
        if isinstance(names, list):
            for i, name in enumerate(names):
                if isinstance(name, str) and name not in registry:
                    issues.append((f"$.{block.name_path}[{i}]", registry.refusal(name)))
        given = lookup(block.options_path)
        if not isinstance(given, dict):
            continue
        keyed = {}
        for name, opts in given.items():
            where = f"$.{block.options_path}.{name}"
            if name not in registry:
                issues.append((where, registry.refusal(name)))
                continue
            value, problems = structure(opts, registry.get(name).options, where)
            issues.extend(problems)
            keyed[name] = value
        values[block.options_path] = keyed
    return values, issues


def _structure_source_entries(lookup: Any, registry: Any, values: dict[str, Any]) -> list[tuple[str, str]]:
    """``data.sources``: every entry's name checked and its options structured against
    that source's options class (``values["data.sources"]``, the entries with structured
    options); and ``data.source``/``data.source_options`` refused beside it."""
    entries = lookup("data.sources")
    if not isinstance(entries, list) or not entries:
        return []
    issues: list[tuple[str, str]] = []
    given = [path for path in ("data.source", "data.source_options") if lookup(path) != _schema_default(path)]
    if given:
        issues.append(
            (
                f"$.{given[0]}",
                (
                    "give one source with data.source (and data.source_options), or a mixture with "
                    "data.sources, not both: move it into data.sources as "
                    "{name: ..., weight: ..., options: ...}"
                ),
            )
        )
    structured = []
    for i, entry in enumerate(entries):
        raw = attrs.asdict(entry, recurse=False) if attrs.has(type(entry)) else entry
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            issues.append(("", ""))  # the schema reports what is wrong with the entry itself
            continue
        where = f"$.data.sources[{i}]"
        if raw["name"] not in registry:
            issues.append((f"{where}.name", unknown_name(registry.kind.label, raw["name"], registry.names())))
            continue
        value, problems = structure(
            raw.get("options", {}), registry.get(raw["name"]).options, f"{where}.options"
        )
        issues.extend(problems)
        if not problems:
            from forge_core.config.schema import SourceEntry

            base = (
                entry if attrs.has(type(entry)) else converter.structure({**raw, "options": {}}, SourceEntry)
            )
            structured.append(attrs.evolve(base, options=value))
    if not issues:
        values["data.sources"] = structured
    return [issue for issue in issues if issue[0]]


def _structure_eval_source(lookup: Any, registry: Any, values: dict[str, Any]) -> list[tuple[str, str]]:
    """``eval.source`` (``""``: the held-out split, no options) checked like any source name,
    and ``eval.source_options`` structured against that source's options class."""
    name, options = lookup("eval.source"), lookup("eval.source_options")
    if not isinstance(name, str) or options is _UNUSABLE:
        return []  # not a name: the schema reports it
    if not name:
        if options not in ({}, None):
            return [
                (
                    "$.eval.source_options",
                    "options for an eval source, but eval.source is '' (the held-out "
                    "split, which takes none): set eval.source to the source they are for",
                )
            ]
        return []
    if name not in registry:
        return [("$.eval.source", registry.refusal(name))]
    value, problems = structure(options, registry.get(name).options, "$.eval.source_options")
    values["eval.source_options"] = value
    return problems


def _with_blocks(config: ForgeConfig, values: dict[str, Any]) -> ForgeConfig:
    for path, value in values.items():
        section, key = path.split(".")
        config = attrs.evolve(config, **{section: attrs.evolve(getattr(config, section), **{key: value})})
    return config


def resolve_components(config: ForgeConfig, registries: Any) -> tuple[ForgeConfig, list[tuple[str, str]]]:
    """Check every component name and structure its option block against its spec's
    options class. Returns the config with option blocks replaced by instances."""
    from forge_core.api import get_path

    values, issues = _structure_blocks(lambda path: get_path(config, path), registries)
    return (config, issues) if issues else (_with_blocks(config, values), [])


def plugin_settings(raw: dict[str, Any]) -> PluginsSection | None:
    """``plugins`` of unstructured config data, or ``None`` when it is invalid (the
    plugins to load, and whose components to prefer, are then unknown)."""
    value, issues = structure(raw.get("plugins", {}), PluginsSection, "$.plugins")
    return None if issues else value


def structure_config(
    raw: dict[str, Any], registries_for: Any, issues: list[tuple[str, str]] = ()
) -> ForgeConfig:
    """Structure config data completely: the schema, then every component's option
    block, reporting the problems of both (after ``issues`` already found, such as bad
    overrides) in one :class:`ConfigError`. The option blocks are structured even when
    the schema has errors, wherever the component's name is known.
    ``registries_for(plugins)`` returns the registries for a ``plugins`` section (what
    it blocks and prefers); it is not called when that section itself is invalid."""
    config, found = structure(raw, ForgeConfig)
    issues = [*issues, *found]
    plugins = config.plugins if config is not None else plugin_settings(raw)
    if plugins is None:
        raise ConfigError(issues)
    registries = registries_for(plugins)
    issues += registries.preference_issues
    values, more = _structure_blocks(_raw_lookup(raw), registries)
    issues += more
    if issues:
        raise ConfigError(issues)
    return _with_blocks(config, values)


def load_config(path: str | Path, overrides: list[str] = (), registries: Any = None) -> ForgeConfig:
    """Read, override, structure and resolve a config; raise ConfigError listing every
    problem. Without ``registries`` the option blocks stay raw mappings."""
    raw, issues = read_raw(path, overrides)
    if registries is None:
        config, found = structure(raw, ForgeConfig)
        if issues or found:
            raise ConfigError([*issues, *found])
        return config
    return structure_config(raw, lambda plugins: registries, issues)


def to_plain(config: ForgeConfig) -> dict[str, Any]:
    """The config as plain data (for ``forge-run show`` and the run directory)."""
    return attrs.asdict(config, recurse=True)
