"""Component option blocks: check each component name a config gives against its
registry and structure its option block (``attention.options``, ``data.sources[i].options``,
``logging.options.<name>``, ...) against the chosen spec's options class."""

from __future__ import annotations

from typing import Any

import attrs

from forge_core.api import ForgeError, import_path
from forge_core.api.unstable import INT_MAX, INT_MIN, did_you_mean, get_path, show_value, unknown_name
from forge_core.config.errors import type_name
from forge_core.config.foreign_keys import unknown_key_hint
from forge_core.config.schema import KEYED_BLOCKS, OPTION_BLOCKS, ForgeConfig, ParallelSection, SourceEntry
from forge_core.config.structuring import MAX_UNKNOWN_SHOWN, structure
from forge_core.parallel_dims import SECTION_KEYS, mesh_dims

#: Where the degrees sit in a lookup (raw data keeps them as keys of ``parallel``).
DEGREES_PATH = "parallel.degrees"

#: A value a block lookup cannot use (its section is not a mapping); the section's own
#: structuring reports why.
_UNUSABLE = object()


def _schema_default(path: str) -> Any:
    section, key = path.split(".")
    field = attrs.fields_dict(attrs.fields_dict(ForgeConfig)[section].type)[key]
    default = field.default
    return default.factory() if isinstance(default, attrs.Factory) else default  # type: ignore[arg-type]


def raw_lookup(raw: dict[str, Any]):
    """Read ``section.key`` from unstructured config data, with the schema's default."""

    def lookup(path: str) -> Any:
        section, key = path.split(".")
        value = raw.get(section, {})
        if not isinstance(value, dict):
            return _UNUSABLE
        if path == DEGREES_PATH:
            return ParallelSection.split_raw(value)[1]
        return value[key] if key in value else _schema_default(path)

    return lookup


def _resolved(spec: Any, options: Any, where: str) -> tuple[Any, list[tuple[str, str]]]:
    """``options`` completed by the spec's ``resolve_options`` function (options the
    config left unset, filled from elsewhere: a checkpoint's config)."""
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


def structure_blocks(lookup: Any, registries: Any) -> tuple[dict[str, Any], list[tuple[str, str]]]:
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
    issues += _structure_degrees(lookup(DEGREES_PATH), registries["parallelism"], values)
    for block in KEYED_BLOCKS:
        registry = registries[block.name]
        names = lookup(block.name_path)
        if isinstance(names, list):
            unknown = [
                (f"$.{block.name_path}[{i}]", name)
                for i, name in enumerate(names)
                if isinstance(name, str) and name not in registry
            ]
            issues += _refusals(registry, unknown, f"$.{block.name_path}")
        given = lookup(block.options_path)
        if not isinstance(given, dict):
            continue
        keyed = {}
        unknown = []
        for name, opts in given.items():
            where = f"$.{block.options_path}.{name}"
            if name not in registry:
                unknown.append((where, name))
                continue
            value, problems = structure(opts, registry.get(name).options, where)
            issues.extend(problems)
            keyed[name] = value
        issues += _refusals(registry, unknown, f"$.{block.options_path}")
        values[block.options_path] = keyed
    return values, issues


def degree_problem(value: Any, dim: Any) -> str | None:
    if type(value) is not int:
        return f"expected an integer, got {show_value(value)} ({type_name(value)})"
    if not INT_MIN <= value <= INT_MAX:
        return f"expected an integer from -2**63 to 2**63-1, got {show_value(value)}"
    if value >= 1 or (value == -1 and dim.fills_world):
        return None
    return f"must be at least 1{', or -1' if dim.fills_world else ''}, got {value}"


def _structure_degrees(given: Any, registry: Any, values: dict[str, Any]) -> list[tuple[str, str]]:
    """``parallel.<dim>``: each key a mesh dimension some registered strategy declares,
    each value a degree (at least 1; -1 where the dimension fills the world); every
    declared dimension gets its default when the config gives none."""
    if not isinstance(given, dict):
        return []
    try:
        dims = {d.name: d for d in mesh_dims(registry)}
    except ForgeError as exc:
        return [("$.parallel", str(exc))]
    issues = []
    keys = [*dims, *SECTION_KEYS]
    unknown = [k for k in given if k not in dims]
    for key in unknown[:MAX_UNKNOWN_SHOWN]:
        hint = did_you_mean(str(key), keys) + unknown_key_hint(ParallelSection, str(key))
        issues.append(
            (
                f"$.parallel.{key}",
                f"unknown key {show_value(key)}.{hint} (keys here: {', '.join(keys)}; each degree "
                "is a mesh dimension a registered strategy declares)",
            )
        )
    if len(unknown) > MAX_UNKNOWN_SHOWN:
        issues.append(("$.parallel", f"and {len(unknown) - MAX_UNKNOWN_SHOWN:,} more unknown keys"))
    degrees = {}
    for name, dim in dims.items():
        value = given.get(name, dim.default)
        problem = degree_problem(value, dim) if name in given else None
        if problem:
            issues.append((f"$.parallel.{name}", problem))
        degrees[name] = value
    values[DEGREES_PATH] = degrees
    return issues


def _refusals(registry: Any, unknown: list[tuple[str, str]], where: str) -> list[tuple[str, str]]:
    """``(path, why)`` for each of the first :data:`MAX_UNKNOWN_SHOWN` unusable names of
    ``unknown`` (``(path, name)`` pairs), then how many more at ``where``: each refusal
    computes a did-you-mean, which a list of 100,000 names must not cost."""
    issues = [(path, registry.refusal(name)) for path, name in unknown[:MAX_UNKNOWN_SHOWN]]
    if len(unknown) > MAX_UNKNOWN_SHOWN:
        more = len(unknown) - MAX_UNKNOWN_SHOWN
        issues.append((where, f"and {more:,} more {registry.kind.label} names that are not registered"))
    return issues


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
        if attrs.has(type(entry)):
            base = entry
        else:
            # The entry's own fields (weight, label) are the schema's to report, at their
            # paths: an entry it refuses is left out here rather than raised.
            base, entry_problems = structure({**raw, "options": {}}, SourceEntry, where)
            if entry_problems:
                issues.append(("", ""))
                continue
        if not problems:
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


def with_blocks(config: ForgeConfig, values: dict[str, Any]) -> ForgeConfig:
    for path, value in values.items():
        section, key = path.split(".")
        config = attrs.evolve(config, **{section: attrs.evolve(getattr(config, section), **{key: value})})
    return config


def resolve_components(config: ForgeConfig, registries: Any) -> tuple[ForgeConfig, list[tuple[str, str]]]:
    """Check every component name and structure its option block against its spec's
    options class. Returns the config with option blocks replaced by instances."""
    values, issues = structure_blocks(lambda path: get_path(config, path), registries)
    return (config, issues) if issues else (with_blocks(config, values), [])
