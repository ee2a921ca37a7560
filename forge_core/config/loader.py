"""Load a config: YAML, dotted overrides, strict structuring, component option blocks.

Every problem found is collected into one :class:`ConfigError` whose lines each start
with the config path (``$.train.lr``), so a user fixes everything in one pass.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml

from forge_core.config.schema import KEYED_BLOCKS, OPTION_BLOCKS, ForgeConfig
from forge_core.errors import ForgeError, did_you_mean, unknown_name


class ConfigError(ForgeError):
    """Every problem found in a config, one ``(path, message)`` per line."""

    def __init__(self, issues: list[tuple[str, str]]):
        self.issues = issues
        super().__init__("\n".join(f"error: {path}: {message}" for path, message in issues))


# --- YAML -------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``3e-4`` as a float (YAML 1.2), not a string (YAML 1.1)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([(where, f"invalid YAML{at}: {problem}")]) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([("$", f"config file {str(path)!r} does not exist")])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([("$", f"cannot read {str(path)!r}: {exc}")]) from None
    raw = parse_yaml(text, "$")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([("$", f"the config must be a mapping of sections, got {type(raw).__name__}")])
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a copy of ``raw``."""
    import copy

    result = copy.deepcopy(raw)
    issues = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            issues.append(("$", f"override {item!r} is not of the form section.key=value"))
            continue
        try:
            value = parse_yaml(text, f"$.{key}")
        except ConfigError as exc:
            issues.extend(exc.issues)
            continue
        target = result
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            nxt = target.setdefault(part, {})
            if nxt is None:
                nxt = target[part] = {}
            if not isinstance(nxt, dict):
                where = "$." + ".".join(parts[: depth + 1])
                issues.append((where, f"override {item!r} goes inside {where}, which is not a mapping"))
                break
            target = nxt
        else:
            target[parts[-1]] = value
    if issues:
        raise ConfigError(issues)
    return result


# --- strict structuring -------------------------------------------------------------


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class ScalarError(TypeError):
    pass


def _strict_int(value: Any, _: type) -> int:
    if type(value) is int:
        return value
    raise ScalarError(f"expected an integer, got {value!r} ({_type_name(value)})")


def _strict_float(value: Any, _: type) -> float:
    if type(value) in (int, float):
        return float(value)
    raise ScalarError(f"expected a number, got {value!r} ({_type_name(value)})")


def _strict_str(value: Any, _: type) -> str:
    if type(value) is str:
        return value
    raise ScalarError(f"expected a string, got {value!r} ({_type_name(value)})")


def _strict_bool(value: Any, _: type) -> bool:
    if type(value) is bool:
        return value
    raise ScalarError(f"expected true or false, got {value!r} ({_type_name(value)})")


def _mapping(value: Any, _: type) -> dict:
    if isinstance(value, dict):
        return dict(value)
    raise ScalarError(f"expected a mapping, got {value!r} ({_type_name(value)})")


def _strict_list(value: Any, cl: type) -> list:
    if not isinstance(value, list):
        raise ScalarError(f"expected a list, got {value!r} ({_type_name(value)})")
    (item_type,) = typing.get_args(cl) or (Any,)
    return [converter.structure(item, item_type) for item in value]


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
                raise cattrs.errors.ClassValidationError(f"While validating {cl.__qualname__}", errors, cl) from None

        return structure_attrs

    return factory


def make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook_factory(attrs.has, _attrs_structure_factory(conv))
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook_func(
        lambda t: typing.get_origin(t) is dict or t is dict, _mapping
    )
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is list, _strict_list)
    return conv


converter = make_converter()


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        known = [a.name for a in attrs.fields(exc.cl)]
        parts = [
            f"unknown key {key!r}.{did_you_mean(key, known)} Keys here: {', '.join(known)}"
            for key in sorted(exc.extra_fields)
        ]
        return "; ".join(parts)
    if isinstance(exc, KeyError):
        return f"required key {exc.args[0]!r} is missing"
    if isinstance(exc, (ScalarError, FieldValidatorError)):
        return str(exc)
    if typing.get_origin(type_) is typing.Literal:
        choices = typing.get_args(type_)
        value = exc.args[0] if exc.args else "?"
        match = re.match(r"(.*) not in literal", str(value))
        got = match.group(1) if match else value
        return f"expected one of {', '.join(map(repr, choices))}, got {got}.{did_you_mean(str(got), map(str, choices))}"
    if attrs.has(type_):
        return f"expected a mapping, got something else ({exc})"
    return f"{type(exc).__name__}: {exc}"


def structure(raw: Any, cls: type, root: str = "$") -> tuple[Any, list[tuple[str, str]]]:
    """Structure ``raw`` into ``cls``; returns ``(instance or None, issues)``."""
    if not isinstance(raw, dict):
        return None, [(root, f"expected a mapping, got {raw!r} ({_type_name(raw)})")]
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


def resolve_components(config: ForgeConfig, registries: Any) -> tuple[ForgeConfig, list[tuple[str, str]]]:
    """Check every component name and structure its option block against its spec's
    options class. Returns the config with option blocks replaced by instances."""
    from forge_core.rules import get_path

    issues: list[tuple[str, str]] = []
    replacements: dict[str, Any] = {}
    for block in OPTION_BLOCKS:
        registry = registries[block.kind]
        name = get_path(config, block.name_path)
        if name not in registry:
            issues.append((f"$.{block.name_path}", unknown_name(registry.kind.label, name, registry.names())))
            continue
        spec = registry.get(name)
        value, problems = structure(get_path(config, block.options_path), spec.options, f"$.{block.options_path}")
        issues.extend(problems)
        replacements[block.options_path] = value
    for block in KEYED_BLOCKS:
        registry = registries[block.kind]
        for i, name in enumerate(get_path(config, block.name_path)):
            if name not in registry:
                issues.append((f"$.{block.name_path}[{i}]", unknown_name(registry.kind.label, name, registry.names())))
        keyed = {}
        for name, opts in get_path(config, block.options_path).items():
            where = f"$.{block.options_path}.{name}"
            if name not in registry:
                issues.append((where, unknown_name(registry.kind.label, name, registry.names())))
                continue
            value, problems = structure(opts, registry.get(name).options, where)
            issues.extend(problems)
            keyed[name] = value
        replacements[block.options_path] = keyed
    if issues:
        return config, issues
    for path, value in replacements.items():
        section, key = path.split(".")
        config = attrs.evolve(config, **{section: attrs.evolve(getattr(config, section), **{key: value})})
    return config, []


def component_options(config: ForgeConfig, section: str, name: str, registry: Any) -> Any:
    """The structured options of a keyed component (a strategy or a logger), defaults when
    the config gives none."""
    given = getattr(config, section).options.get(name)
    return given if given is not None else registry.get(name).options()


def load_config(path: str | Path, overrides: list[str] = (), registries: Any = None) -> ForgeConfig:
    """Read, override, structure and resolve a config; raise ConfigError listing every
    problem. Without ``registries`` the option blocks stay raw mappings."""
    raw = apply_overrides(read_config_file(path), list(overrides))
    config, issues = structure(raw, ForgeConfig)
    if issues:
        raise ConfigError(issues)
    if registries is not None:
        config, issues = resolve_components(config, registries)
        if issues:
            raise ConfigError(issues)
    return config


def to_plain(config: ForgeConfig) -> dict[str, Any]:
    """The config as plain data (for ``forge-run show`` and the run directory)."""
    return attrs.asdict(config, recurse=True)
