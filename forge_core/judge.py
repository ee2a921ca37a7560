"""Judge a config completely before anything is built: load, resolve components,
evaluate every rule. Shared by ``forge-run check`` and ``forge-run train``."""

from __future__ import annotations

from typing import Any

import attrs

from forge_core.config.loader import ConfigError, load_config, resolve_components
from forge_core.config.schema import OPTION_BLOCKS, ForgeConfig
from forge_core.parallel_dims import active_strategies, resolve_degrees, world_size_from_env
from forge_core.registry import Registries, load_registries
from forge_core.rules import RuleContext, Violation, evaluate, get_path


@attrs.frozen
class Judgement:
    config: ForgeConfig
    registries: Registries
    context: RuleContext
    violations: list[Violation]

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "error"]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "warning"]


def rule_context(config: ForgeConfig, registries: Registries, world_size: int | None) -> RuleContext:
    specs = {
        block.kind: registries[block.kind].get(get_path(config, block.name_path)) for block in OPTION_BLOCKS
    }
    degrees = resolve_degrees(config.parallel, world_size)
    strategies = active_strategies(registries["parallelism"], degrees, config.parallel.wrappers)
    emitted = specs["packer"].emitted(config.data.packer_options)
    return RuleContext(config, specs, tuple(strategies), degrees, world_size, emitted)


def load_resolved(
    config_path: str, overrides: list[str] = (), extra_plugins: tuple[tuple[str, Any], ...] = ()
) -> tuple[ForgeConfig, Registries]:
    """Load a config, load the plugins it does not block, and resolve its components."""
    config = load_config(config_path, overrides)
    registries = load_registries(block=tuple(config.plugins.block), extra=extra_plugins)
    config, issues = resolve_components(config, registries)
    if issues:
        raise ConfigError(issues)
    return config, registries


def judge(
    config_path: str,
    overrides: list[str] = (),
    world_size: int | None = None,
    extra_plugins: tuple[tuple[str, Any], ...] = (),
) -> Judgement:
    """Load and judge a config. Raises ConfigError (every config problem) or ForgeError
    (plugin problems); rule violations are returned, not raised."""
    config, registries = load_resolved(config_path, overrides, extra_plugins)
    if world_size is None:
        world_size = world_size_from_env()
    ctx = rule_context(config, registries, world_size)
    return Judgement(config, registries, ctx, evaluate(registries.rules, ctx))
