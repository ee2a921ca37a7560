"""The kernel's own checks of the components a plan will build, reported with the rule
violations: every chosen implementation module is installed (found now by ``check``
instead of as a traceback when the run builds it), and a name that ``plugins.prefer``
took from one of several plugins is said every time. The plugin loader's warnings (a
hook function not marked, a blocked name no plugin has) join them."""

from __future__ import annotations

import importlib.util
from typing import Any

from forge_core.api import Plan
from forge_core.api.unstable import Violation, get_path
from forge_core.config.schema import OPTION_BLOCKS
from forge_core.registry import Registries

#: The id under which a chosen component whose implementation module is missing is
#: reported (the kernel checks it for every component; it is not a declared rule).
IMPLEMENTATION_FOUND = "component.implementation-found"
#: The id of the warning for a chosen component that ``plugins.prefer`` took from one
#: plugin over another's of the same name.
COMPONENT_SHADOWED = "component.shadowed"


def chosen_components(ctx: Plan, registries: Registries) -> list[tuple[str, str, Any]]:
    """``(config path, kind, spec)`` of every component the run will build: every source
    of a mixture (``data.sources[i].name``) included."""
    chosen = [(b.name_path, b.name, ctx.specs[b.name]) for b in OPTION_BLOCKS if b.name != "source"]
    chosen += [
        (s.where if s.where == "data.source" else f"{s.where}.name", "source", s.spec) for s in ctx.sources
    ]
    if ctx.eval_source is not None:
        chosen.append(("eval.source", "source", ctx.eval_source.spec))
    chosen += [
        (_switch_of(s.spec, ctx.config.parallel.wrappers), "parallelism", s.spec) for s in ctx.strategies
    ]
    chosen += [("logging.loggers", "logger", registries["logger"].get(n)) for n in ctx.config.logging.loggers]
    return chosen


def _switch_of(spec: Any, wrappers: list[str]) -> str:
    """The config path that switched an active strategy on: its degree, its name in
    ``parallel.wrappers``, or the setting its spec names in ``enabled_by``."""
    if spec.mesh_dim:
        return f"parallel.{spec.mesh_dim}"
    return "parallel.wrappers" if spec.name in wrappers or spec.enabled_by is None else spec.enabled_by


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
        violations.append(
            Violation(
                IMPLEMENTATION_FOUND,
                "error",
                plugin,
                f"{registry.kind.label} {spec.name!r} (plugin {plugin!r}, from {dist}) names its "
                f"implementation {spec.impl!r}, but module {module!r} cannot be found ({why}): the run "
                "would fail when it builds the component",
                f"Reinstall {info.distribution if info else 'the plugin'}, or report the wrong impl path to "
                f"its authors; or choose another {registry.kind.label} "
                f"(available: {', '.join(registry.names())}).",
                ((path, get_path(ctx.config, path)),),
            )
        )
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
        violations.append(
            Violation(
                COMPONENT_SHADOWED,
                "warning",
                chosen,
                f"{registry.kind.label} {spec.name!r} is the one of plugin {chosen!r}, as plugins.prefer "
                f"says; it shadows the one of {others}",
                f"Nothing to do if {chosen!r} is the one you mean; plugins.prefer.{kind}.{spec.name}: "
                f"{hidden[0].plugin} takes the other.",
                ((path, get_path(ctx.config, path)), (f"plugins.prefer.{kind}.{spec.name}", chosen)),
            )
        )
    return violations


def component_violations(ctx: Plan, registries: Registries) -> list[Violation]:
    """Both checks, errors (missing implementations) first, then what loading the plugins
    warned about (:attr:`forge_core.plugins.LoadedPlugins.warnings`)."""
    return (
        implementation_violations(ctx, registries)
        + shadow_violations(ctx, registries)
        + list(registries.plugins.warnings)
    )
