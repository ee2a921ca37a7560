"""The :class:`~forge_core.api.Plan` of a resolved config: made once, here; the rules
judge it and the run builds from it.

It holds the chosen spec of each kind, the degrees resolved against the world size, the
active strategies in application order with their options, the packer's metadata and
the model's facts."""

from __future__ import annotations

from typing import Any

from forge_core.api import ActiveStrategy, ChosenSource, ChosenTransform, ForgeError, Plan
from forge_core.api.unstable import get_path
from forge_core.config.schema import OPTION_BLOCKS, ForgeConfig
from forge_core.parallel_dims import active_strategies, mesh_dims, resolve_degrees
from forge_core.registry import Registries


def component_options(config: ForgeConfig, name: str, registry: Any) -> Any:
    """The structured options of a keyed component (a transform, a strategy or a logger):
    those under its kind's options path, defaults when the config gives none."""
    given = get_path(config, registry.kind.options_path).get(name)
    return given if given is not None else registry.get(name).options()


def make_plan(config: ForgeConfig, registries: Registries, world_size: int | None) -> Plan:
    """The plan of a resolved config, with the degrees resolved against ``world_size``
    (``None``: unknown, left unchecked)."""
    specs = {
        block.name: registries[block.name].get(get_path(config, block.name_path)) for block in OPTION_BLOCKS
    }
    registry = registries["parallelism"]
    options = {name: component_options(config, name, registry) for name in registry.names()}
    facts = model_facts(specs["model"], config.model.options, registries)
    sources = tuple(
        ChosenSource(
            where, registries["source"].get(entry.name), entry.options, float(entry.weight), entry.label
        )
        for where, entry in config.data.source_entries()
    )
    specs["source"] = sources[0].spec
    dims = mesh_dims(registry)
    degrees = resolve_degrees(config.parallel.degrees, dims, world_size)
    strategies = tuple(
        ActiveStrategy(spec, options[spec.name], registry.plugin_of(spec.name))
        for spec in active_strategies(
            registry, degrees, config.parallel.wrappers, lambda path: get_path(config, path, False)
        )
    )
    emitted = specs["packer"].emitted(config.data.packer_options)
    ev = config.eval
    eval_source = (
        ChosenSource("eval.source", registries["source"].get(ev.source), ev.source_options)
        if ev.source
        else None
    )
    chosen = registries["transform"]
    transforms = tuple(
        ChosenTransform(chosen.get(name), component_options(config, name, chosen), chosen.plugin_of(name))
        for name in config.model.transforms
    )
    return Plan(
        config,
        specs,
        strategies,
        degrees,
        world_size,
        emitted,
        facts,
        options,
        sources,
        eval_source,
        dims,
        transforms,
    )


def model_facts(spec: Any, options: Any, registries: Registries) -> Any:
    """``spec.facts(options)``, or ``None`` for a model that declares none; plugin code,
    so a failure names the plugin."""
    if spec.facts is None:
        return None
    try:
        return spec.facts(options)
    except Exception as exc:
        plugin = registries["model"].plugin_of(spec.name)
        raise ForgeError(
            f"model {spec.name!r} (plugin {plugin!r}): its facts function raised "
            f"{type(exc).__name__}: {exc}. Report this to the plugin's authors, or choose another model."
        ) from exc
