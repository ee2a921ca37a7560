"""Judge a config completely before anything is built: load, resolve components,
evaluate every rule, find every chosen implementation. Shared by ``forge-run check`` and
``forge-run train``, so a config ``check`` accepts is the config a run builds: the
:class:`~forge_core.api.Plan` made here is what the rules judge and what the trainer and
``parallelize`` build from."""

from __future__ import annotations

import importlib.util
from typing import Any

import attrs

from forge_core.api import ActiveStrategy, ChosenSource, ForgeError, Plan, Violation, get_path
from forge_core.config.loader import component_options, read_raw, structure_config
from forge_core.config.schema import OPTION_BLOCKS, ForgeConfig, PluginsSection
from forge_core.parallel_dims import active_strategies, resolve_degrees, world_size_from_env
from forge_core.registry import Registries, load_registries
from forge_core.rules import evaluate

#: The id under which a chosen component whose implementation module is missing is
#: reported (the kernel checks it for every component; it is not a declared rule).
IMPLEMENTATION_FOUND = "component.implementation-found"
#: The id of the warning for a chosen component that ``plugins.prefer`` took from one
#: plugin over another's of the same name.
COMPONENT_SHADOWED = "component.shadowed"


@attrs.frozen
class Judgement:
    config: ForgeConfig
    registries: Registries
    plan: Plan
    violations: list[Violation]

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "error"]

    @property
    def warnings(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "warning"]

    @property
    def kernel_rules(self) -> int:
        """How many of the evaluated rules are the kernel's (they cannot be blocked)."""
        return sum(entry.kernel for entry in self.registries.rules)


def make_plan(config: ForgeConfig, registries: Registries, world_size: int | None) -> Plan:
    """The :class:`~forge_core.api.Plan` of a resolved config: the chosen specs, the
    degrees resolved against ``world_size``, the active strategies in application order
    with their options, the packer's metadata and the model's facts. Computed once,
    here; the rules judge it and the run builds from it."""
    specs = {
        block.kind: registries[block.kind].get(get_path(config, block.name_path)) for block in OPTION_BLOCKS
    }
    sources = tuple(
        ChosenSource(where, registries["source"].get(entry.name), entry.options, float(entry.weight), entry.label)
        for where, entry in config.data.source_entries()
    )
    specs["source"] = sources[0].spec
    degrees = resolve_degrees(config.parallel, world_size)
    registry = registries["parallelism"]
    options = {name: component_options(config, "parallel", name, registry) for name in registry.names()}
    strategies = tuple(
        ActiveStrategy(spec, options[spec.name], registry.plugin_of(spec.name))
        for spec in active_strategies(registry, degrees, config.parallel.wrappers)
    )
    emitted = specs["packer"].emitted(config.data.packer_options)
    facts = model_facts(specs["model"], config.model.options, registries)
    ev = config.eval
    eval_source = ChosenSource("eval.source", registries["source"].get(ev.source), ev.source_options) if ev.source else None
    return Plan(config, specs, strategies, degrees, world_size, emitted, facts, options, sources, eval_source)


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


def chosen_components(ctx: Plan, registries: Registries) -> list[tuple[str, str, Any]]:
    """``(config path, kind, spec)`` of every component the run will build: every source
    of a mixture (``data.sources[i].name``) included."""
    chosen = [(b.name_path, b.kind, ctx.specs[b.kind]) for b in OPTION_BLOCKS if b.kind != "source"]
    chosen += [(s.where if s.where == "data.source" else f"{s.where}.name", "source", s.spec) for s in ctx.sources]
    if ctx.eval_source is not None:
        chosen.append(("eval.source", "source", ctx.eval_source.spec))
    chosen += [
        (f"parallel.{s.spec.mesh_dim}" if s.spec.mesh_dim else "parallel.wrappers", "parallelism", s.spec)
        for s in ctx.strategies
    ]
    chosen += [("logging.loggers", "logger", registries["logger"].get(n)) for n in ctx.config.logging.loggers]
    return chosen


def _module_missing(module: str) -> str | None:
    """Why ``module`` cannot be imported, or ``None`` when it can be found. Looks the
    module up without running it (its parent packages are imported, as for any import)."""
    try:
        found = importlib.util.find_spec(module)
    except (Exception, SystemExit) as exc:  # a parent package is missing or fails to import
        return f"{type(exc).__name__}: {exc}"
    return None if found is not None else f"no module named {module!r}"


def implementation_violations(ctx: Plan, registries: Registries) -> list[Violation]:
    """An error for every chosen component whose ``impl`` module is not installed: found
    now by ``check`` instead of as a traceback when the run builds it."""
    violations = []
    for path, kind, spec in chosen_components(ctx, registries):
        module = spec.impl.partition(":")[0]
        why = _module_missing(module)
        if why is None:
            continue
        registry = registries[kind]
        plugin = registry.plugin_of(spec.name)
        info = registries.plugins.infos.get(plugin)
        dist = f"{info.distribution} {info.version}".strip() if info else "an unknown distribution"
        violations.append(Violation(
            IMPLEMENTATION_FOUND, "error", plugin,
            f"{registry.kind.label} {spec.name!r} (plugin {plugin!r}, from {dist}) names its "
            f"implementation {spec.impl!r}, but module {module!r} cannot be found ({why}): the run "
            "would fail when it builds the component",
            f"Reinstall {info.distribution if info else 'the plugin'}, or report the wrong impl path to "
            f"its authors; or choose another {registry.kind.label} (available: {', '.join(registry.names())}).",
            ((path, get_path(ctx.config, path)),),
        ))
    return violations


def shadow_violations(ctx: Plan, registries: Registries) -> list[Violation]:
    """A warning for every chosen component whose name another plugin registers too: the
    config chose it in ``plugins.prefer``, and the report says so, every time."""
    violations = []
    for path, kind, spec in chosen_components(ctx, registries):
        registry = registries[kind]
        hidden = registry.shadowed.get(spec.name)
        if not hidden:
            continue
        chosen = registry.plugin_of(spec.name)
        others = ", ".join(repr(e.plugin) for e in hidden)
        violations.append(Violation(
            COMPONENT_SHADOWED, "warning", chosen,
            f"{registry.kind.label} {spec.name!r} is the one of plugin {chosen!r}, as plugins.prefer "
            f"says; it shadows the one of {others}",
            f"Nothing to do if {chosen!r} is the one you mean; plugins.prefer.{kind}.{spec.name}: "
            f"{hidden[0].plugin} takes the other.",
            ((path, get_path(ctx.config, path)), (f"plugins.prefer.{kind}.{spec.name}", chosen)),
        ))
    return violations


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


def judge(
    config_path: str,
    overrides: list[str] = (),
    world_size: int | None = None,
    extra_plugins: tuple[tuple[str, Any], ...] = (),
) -> Judgement:
    """Load and judge a config. Raises ConfigError (every config problem) or ForgeError
    (plugin problems); rule violations are returned, not raised."""
    config, registries = load_resolved(config_path, overrides, extra_plugins)
    return judge_config(config, registries, world_size)


def judge_config(config: ForgeConfig, registries: Registries, world_size: int | None = None) -> Judgement:
    """Evaluate every rule over a resolved config, and look up every chosen component's
    implementation module."""
    if world_size is None:
        world_size = world_size_from_env()
    plan = make_plan(config, registries, world_size)
    violations = (evaluate(registries.rules, plan) + implementation_violations(plan, registries)
                  + shadow_violations(plan, registries))
    return Judgement(config, registries, plan, violations)
