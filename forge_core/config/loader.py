"""Load a config: read the YAML file, apply the overrides, structure the schema and then
every component's option block, and raise one :class:`ConfigError` listing every
problem. Each step lives in its own module; this one puts them in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from forge_core.api.options import option_key
from forge_core.config.blocks import raw_lookup, structure_blocks, with_blocks
from forge_core.config.errors import ConfigError
from forge_core.config.overrides import with_overrides
from forge_core.config.phases import phase_issues
from forge_core.config.schema import ForgeConfig, PluginsSection
from forge_core.config.structuring import structure
from forge_core.config.yaml_reader import read_config_file


def read_raw(path: str | Path, overrides: list[str] = ()) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The config file with the valid overrides applied, as plain data (not yet
    structured), and the problems of the other overrides and of moved keys (reported
    with the rest)."""
    return with_overrides(read_config_file(path), overrides)


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
    issues = [*issues, *found, *(phase_issues(config) if config is not None else [])]
    plugins = config.plugins if config is not None else plugin_settings(raw)
    if plugins is None:
        raise ConfigError(issues)
    registries = registries_for(plugins)
    issues += registries.preference_issues
    values, more = structure_blocks(raw_lookup(raw), registries)
    issues += more
    if issues:
        raise ConfigError(issues)
    return with_blocks(config, values)


def load_config(path: str | Path, overrides: list[str] = (), registries: Any = None) -> ForgeConfig:
    """Read, override, structure and resolve a config; raise ConfigError listing every
    problem. Without ``registries`` the option blocks stay raw mappings."""
    raw, issues = read_raw(path, overrides)
    if registries is None:
        config, found = structure(raw, ForgeConfig)
        found += phase_issues(config) if config is not None else []
        if issues or found:
            raise ConfigError([*issues, *found])
        return config
    return structure_config(raw, lambda plugins: registries, issues)


def to_plain(config: ForgeConfig) -> dict[str, Any]:
    """The config as plain data (for ``forge-run show`` and the run directory), the
    degrees back where a config writes them (``parallel.tp``), so it loads again."""
    plain = _plain(config)
    parallel = plain["parallel"]
    plain["parallel"] = {**parallel.pop("degrees"), **parallel}
    return plain


def _plain(value: Any) -> Any:
    """``attrs.asdict`` by config key (:func:`~forge_core.api.options.option_key`): each
    attribute under the key a config writes for it (``checkpoint.async``)."""
    if attrs.has(type(value)):
        return {option_key(f): _plain(getattr(value, f.name)) for f in attrs.fields(type(value))}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return value
