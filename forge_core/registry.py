"""Typed registries, one per kind of component (:data:`forge_core.kinds.KINDS`), built
from the registration hooks.

Each hookimpl is called on its own so every spec is attributed to the plugin that
returned it, and ``forge-run plugins`` can list what each plugin contributes.

A name that several plugins register (a third-party ``wsd`` schedule beside the built-in
one) is a *clash*: no config can use that name until it says whose it means, in
``plugins.prefer`` (``{schedule: {wsd: my_plugin}}``), and everything else every plugin
registers stays usable. Nothing wins by load order or by being third-party: a config
that uses a clashing name without choosing gets an error naming both plugins, and a
chosen one that shadows another is reported as a warning by ``forge-run check``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from forge_core.api import ForgeError, Rule
from forge_core.api.unstable import did_you_mean, unknown_name
from forge_core.kinds import KINDS, Kind
from forge_core.plugins import KERNEL_PLUGINS, LoadedPlugins, PluginRaised, call_plugin, load_plugins


@attrs.frozen
class Entry:
    spec: Any
    plugin: str


@attrs.frozen
class Clash:
    """A name registered by several plugins with none chosen: no config can use it."""

    entries: tuple[Entry, ...]
    message: str


@attrs.frozen
class Registry:
    """The components of one kind, by name: the usable ones (``entries``), the clashing
    names no ``plugins.prefer`` resolved (``clashes``), and the components a preference
    hid (``shadowed``, by name)."""

    kind: Kind
    entries: dict[str, Entry]
    clashes: dict[str, Clash] = attrs.field(factory=dict)
    shadowed: dict[str, tuple[Entry, ...]] = attrs.field(factory=dict)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def refusal(self, name: str) -> str:
        """Why ``name`` cannot be used: its clash, or unknown with a did-you-mean."""
        if name in self.clashes:
            return self.clashes[name].message
        return unknown_name(self.kind.label, name, [*self.entries, *self.clashes])

    def get(self, name: str, path: str | None = None) -> Any:
        """The spec registered as ``name``; an unknown or clashing name is a ForgeError
        saying what exists, or how to choose."""
        try:
            return self.entries[name].spec
        except (KeyError, TypeError):
            where = f"{path}: " if path else ""
            raise ForgeError(where + self.refusal(name)) from None

    def plugin_of(self, name: str) -> str:
        return self.entries[name].plugin


@attrs.frozen
class RuleEntry:
    """A rule and the plugin that declared it; ``kernel`` rules cannot be blocked."""

    rule: Rule
    plugin: str
    kernel: bool = False


@attrs.frozen
class Registries:
    """All registries plus the rules, from one set of loaded plugins; the problems of the
    ``plugins.prefer`` they were built with, as ``(config path, message)``."""

    plugins: LoadedPlugins
    by_kind: dict[str, Registry]
    rules: tuple[RuleEntry, ...]
    preference_issues: tuple[tuple[str, str], ...] = ()

    def __getitem__(self, kind: str) -> Registry:
        return self.by_kind[kind]

    def __iter__(self) -> Iterator[Registry]:
        return iter(self.by_kind.values())


def _results(plugins: LoadedPlugins, hook_name: str) -> Iterator[tuple[str, Any]]:
    """Call every implementation of a registration hook, yielding (plugin, item)."""
    hook = getattr(plugins.pm.hook, hook_name)
    for impl in hook.get_hookimpls():  # registration order
        try:
            result = call_plugin(impl.function)
        except PluginRaised as fault:  # sys.exit(), a KeyboardInterrupt of its own, ...
            exc = fault.original
            raise ForgeError(
                f"plugin {impl.plugin_name!r} raised in {hook_name}(): {fault.shown}. "
                f"{_remedy(plugins, impl.plugin_name)}"
            ) from (exc if isinstance(exc, Exception) else None)
        if result is None:
            continue
        if not isinstance(result, (list, tuple)):
            raise ForgeError(
                f"plugin {impl.plugin_name!r}: {hook_name}() must return a list, got {type(result).__name__}."
            )
        for item in result:
            yield impl.plugin_name, item


def _remedy(plugins: LoadedPlugins, name: str) -> str:
    if name in KERNEL_PLUGINS:
        return "This is a bug in Forge itself: please report it."
    info = plugins.infos.get(name)
    dist = f" or uninstall {info.distribution}" if info and not info.builtin else ""
    return f"Block it with FORGE_BLOCK_PLUGINS={name}{dist} to continue without it."


def _origin(plugins: LoadedPlugins, name: str) -> str:
    info = plugins.infos.get(name)
    if info is None:
        return repr(name)
    version = f" {info.version}" if info.version else ""
    return f"{name!r} ({info.distribution}{version}{', built-in' if info.builtin else ''})"


def _is_third_party(plugins: LoadedPlugins, name: str) -> bool:
    info = plugins.infos.get(name)
    return name not in KERNEL_PLUGINS and not (info is not None and info.builtin)


def _clash(plugins: LoadedPlugins, kind: Kind, name: str, entries: tuple[Entry, ...]) -> Clash:
    """The clash of ``name`` and how to resolve it. It never advises blocking a built-in
    plugin: that would take its other components and its rules away too."""
    owners = [e.plugin for e in entries]
    origins = ", ".join(_origin(plugins, o) for o in owners[:-1]) + f" and {_origin(plugins, owners[-1])}"
    third_party = [o for o in owners if _is_third_party(plugins, o)]
    pick = third_party[0] if third_party else owners[0]
    others = " or ".join(o for o in owners if o != pick)
    message = (
        f"{kind.label} {name!r} is registered by {len(owners)} plugins: {origins}. Say which one a "
        f"config means with plugins.prefer: {{{kind.name}: {{{name}: {pick}}}}} (or {others}); the "
        "other components of each stay available."
    )
    if third_party:
        dists = sorted(
            {
                plugins.infos[o].distribution
                for o in third_party
                if o in plugins.infos and not plugins.infos[o].distribution.startswith("<")
            }
        )
        skip = " or ".join(f"FORGE_BLOCK_PLUGINS={o}" for o in third_party)
        ways = [
            f"skip the third-party plugin with {skip} (everything it registers goes with it)",
            *([f"uninstall {' or '.join(dists)}"] if dists else []),
            "ask its authors to rename the component",
        ]
        message += f" Or {', '.join(ways[:-1])}, or {ways[-1]}."
    return Clash(entries, message)


def _preferred(
    plugins: LoadedPlugins, kind: Kind, name: str, found: list[Entry], plugin: str
) -> tuple[Entry | None, str | None]:
    """The entry ``plugins.prefer`` names for ``name``, or the problem with the choice."""
    for entry in found:
        if entry.plugin == plugin:
            return entry, None
    owners = [e.plugin for e in found]
    blocked = " (it is blocked)" if plugin in plugins.blocked else ""
    return None, (
        f"plugin {plugin!r}{blocked} does not register the {kind.label} {name!r}, "
        f"which {' and '.join(map(repr, owners))} {'does' if len(owners) == 1 else 'do'}."
        f"{did_you_mean(plugin, owners)} Name one of: {', '.join(owners)}."
    )


def _apply_preferences(
    plugins: LoadedPlugins, kind: Kind, candidates: dict[str, list[Entry]], prefer: dict[str, str]
) -> tuple[Registry, list[tuple[str, str]]]:
    entries: dict[str, Entry] = {}
    clashes: dict[str, Clash] = {}
    shadowed: dict[str, tuple[Entry, ...]] = {}
    issues: list[tuple[str, str]] = []
    for name, plugin in prefer.items():
        if name not in candidates:
            issues.append(
                (f"$.plugins.prefer.{kind.name}.{name}", unknown_name(kind.label, name, candidates))
            )
    for name, found in candidates.items():
        chosen, problem = (
            _preferred(plugins, kind, name, found, prefer[name]) if name in prefer else (None, None)
        )
        if problem:
            issues.append((f"$.plugins.prefer.{kind.name}.{name}", problem))
        if chosen is not None:
            entries[name] = chosen
            if len(found) > 1:
                shadowed[name] = tuple(e for e in found if e is not chosen)
        elif len(found) == 1:
            entries[name] = found[0]
        else:
            built_in_first = sorted(found, key=lambda e: (_is_third_party(plugins, e.plugin), e.plugin))
            clashes[name] = _clash(plugins, kind, name, tuple(built_in_first))
    return Registry(kind, entries, clashes, shadowed), issues


def build_registries(plugins: LoadedPlugins, prefer: dict[str, dict[str, str]] | None = None) -> Registries:
    """The registries of ``plugins``; ``prefer`` (the config's ``plugins.prefer``, kind ->
    component name -> plugin) says whose component a clashing name means."""
    prefer = prefer or {}
    kinds = {kind.name for kind in KINDS}
    issues = [
        (f"$.plugins.prefer.{k}", unknown_name("kind of component", k, kinds))
        for k in prefer
        if k not in kinds
    ]
    by_kind: dict[str, Registry] = {}
    for kind in KINDS:
        candidates: dict[str, list[Entry]] = {}
        for plugin, spec in _results(plugins, kind.hook):
            if not isinstance(spec, kind.spec_cls):
                raise ForgeError(
                    f"plugin {plugin!r}: {kind.hook}() returned {spec!r}; expected "
                    f"{kind.spec_cls.__name__} objects."
                )
            found = candidates.setdefault(spec.name, [])
            if any(e.plugin == plugin for e in found):
                raise ForgeError(
                    f"plugin {plugin!r} registers the {kind.label} {spec.name!r} twice. "
                    f"{_remedy(plugins, plugin)}"
                )
            found.append(Entry(spec, plugin))
        by_kind[kind.name], more = _apply_preferences(plugins, kind, candidates, prefer.get(kind.name, {}))
        issues += more
    rules: dict[str, RuleEntry] = {}
    for plugin, rule in _results(plugins, "forge_rules"):
        if not isinstance(rule, Rule):
            raise ForgeError(f"plugin {plugin!r}: forge_rules() returned {rule!r}; expected Rule objects.")
        if rule.id in rules:
            raise ForgeError(
                f"rule {rule.id!r} is declared by two plugins: {rules[rule.id].plugin!r} and {plugin!r}."
            )
        rules[rule.id] = RuleEntry(rule, plugin, kernel=plugin in KERNEL_PLUGINS)
    return Registries(plugins, by_kind, tuple(rules.values()), tuple(issues))


def load_registries(
    block: tuple[str, ...] = (),
    extra: tuple[tuple[str, Any], ...] = (),
    prefer: dict[str, dict[str, str]] | None = None,
) -> Registries:
    """Load plugins and build the registries in one call."""
    return build_registries(load_plugins(block=block, extra=extra), prefer)
