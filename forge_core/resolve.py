"""A config file resolved: the config read and overridden, the plugins it does not block
loaded, and every component's option block structured against its spec."""

from __future__ import annotations

from typing import Any

from forge_core.config.loader import read_raw, structure_config
from forge_core.config.schema import ForgeConfig, PluginsSection
from forge_core.registry import Registries, load_registries


def load_resolved(
    config_path: str, overrides: list[str] = (), extra_plugins: tuple[tuple[str, Any], ...] = ()
) -> tuple[ForgeConfig, Registries]:
    """Load a config, load the plugins it does not block, and resolve its components;
    every problem of the schema and of the option blocks in one ConfigError."""
    raw, issues = read_raw(config_path, overrides)
    loaded: list[Registries] = []

    def registries_for(plugins: PluginsSection) -> Registries:
        loaded.append(load_registries(block=tuple(plugins.block), extra=extra_plugins, prefer=plugins.prefer))
        return loaded[-1]

    config = structure_config(raw, registries_for, issues)
    return config, loaded[-1]
