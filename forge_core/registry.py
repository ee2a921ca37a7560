"""Typed registries, one per kind of component, built from the registration hooks.

Each hookimpl is called on its own so every spec is attributed to the plugin that
returned it: a name registered twice is an error naming both plugins, and
``forge-run plugins`` can list what each plugin contributes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from forge_core.api import specs as S
from forge_core.api import ForgeError, Rule, unknown_name
from forge_core.plugins import KERNEL_PLUGINS, LoadedPlugins, load_plugins


@attrs.frozen
class Kind:
    """One kind of component: the hook that registers it, its spec class, a label."""

    name: str
    hook: str
    spec_cls: type
    label: str
    plural: str = ""

    @property
    def title(self) -> str:
        return (self.plural or self.label + "s").capitalize()


KINDS: tuple[Kind, ...] = (
    Kind("model", "forge_models", S.ModelSpec, "model"),
    Kind("attention", "forge_attention_backends", S.AttentionBackendSpec, "attention backend"),
    Kind("source", "forge_sources", S.SourceSpec, "data source"),
    Kind("tokenizer", "forge_tokenizers", S.TokenizerSpec, "tokenizer"),
    Kind("packer", "forge_packers", S.PackerSpec, "packer"),
    Kind("parallelism", "forge_parallelisms", S.ParallelismSpec, "parallelism strategy", "parallelism strategies"),
    Kind("optimizer", "forge_optimizers", S.OptimizerSpec, "optimizer"),
    Kind("schedule", "forge_schedules", S.ScheduleSpec, "schedule"),
    Kind("logger", "forge_loggers", S.LoggerSpec, "logger"),
)


@attrs.frozen
class Entry:
    spec: Any
    plugin: str


@attrs.frozen
class Registry:
    """The components of one kind, by name."""

    kind: Kind
    entries: dict[str, Entry]

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def get(self, name: str, path: str | None = None) -> Any:
        """The spec registered as ``name``; an unknown name is a ForgeError with a
        did-you-mean and the list of available names."""
        try:
            return self.entries[name].spec
        except (KeyError, TypeError):
            raise ForgeError(unknown_name(self.kind.label, name, self.entries, path)) from None

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
    """All registries plus the rules, from one set of loaded plugins."""

    plugins: LoadedPlugins
    by_kind: dict[str, Registry]
    rules: tuple[RuleEntry, ...]

    def __getitem__(self, kind: str) -> Registry:
        return self.by_kind[kind]

    def __iter__(self) -> Iterator[Registry]:
        return iter(self.by_kind.values())


def _results(plugins: LoadedPlugins, hook_name: str) -> Iterator[tuple[str, Any]]:
    """Call every implementation of a registration hook, yielding (plugin, item)."""
    hook = getattr(plugins.pm.hook, hook_name)
    for impl in hook.get_hookimpls():  # registration order
        try:
            result = impl.function()
        except (Exception, SystemExit) as exc:  # SystemExit: a plugin calling sys.exit()
            raise ForgeError(
                f"plugin {impl.plugin_name!r} raised in {hook_name}(): {type(exc).__name__}: {exc}. "
                f"{_remedy(plugins, impl.plugin_name)}"
            ) from (None if isinstance(exc, SystemExit) else exc)
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


def _clash_fix(plugins: LoadedPlugins, names: tuple[str, str]) -> str:
    """How to resolve two plugins registering one name. Never advice to block a built-in
    plugin: that would take its other components and its rules away too."""
    infos = plugins.infos
    third_party = [n for n in names if n not in KERNEL_PLUGINS and not (n in infos and infos[n].builtin)]
    if not third_party:
        return "This is a bug in Forge itself: please report it."
    shown = " or ".join(f"FORGE_BLOCK_PLUGINS={n}" for n in third_party)
    dists = sorted({infos[n].distribution for n in third_party if n in infos})
    return (
        f"Skip the third-party one with {shown} (everything it registers goes with it), uninstall "
        f"{' or '.join(dists) or 'it'}, or ask its authors to rename the component."
    )


def build_registries(plugins: LoadedPlugins) -> Registries:
    by_kind: dict[str, Registry] = {}
    for kind in KINDS:
        entries: dict[str, Entry] = {}
        for plugin, spec in _results(plugins, kind.hook):
            if not isinstance(spec, kind.spec_cls):
                raise ForgeError(
                    f"plugin {plugin!r}: {kind.hook}() returned {spec!r}; expected "
                    f"{kind.spec_cls.__name__} objects."
                )
            if spec.name in entries:
                first = entries[spec.name].plugin
                raise ForgeError(
                    f"{kind.label} {spec.name!r} is registered by two plugins: {first!r} and "
                    f"{plugin!r}. {_clash_fix(plugins, (first, plugin))}"
                )
            entries[spec.name] = Entry(spec, plugin)
        by_kind[kind.name] = Registry(kind, entries)
    rules: dict[str, RuleEntry] = {}
    for plugin, rule in _results(plugins, "forge_rules"):
        if not isinstance(rule, Rule):
            raise ForgeError(f"plugin {plugin!r}: forge_rules() returned {rule!r}; expected Rule objects.")
        if rule.id in rules:
            raise ForgeError(
                f"rule {rule.id!r} is declared by two plugins: {rules[rule.id].plugin!r} and {plugin!r}."
            )
        rules[rule.id] = RuleEntry(rule, plugin, kernel=plugin in KERNEL_PLUGINS)
    return Registries(plugins, by_kind, tuple(rules.values()))


def load_registries(block: tuple[str, ...] = (), extra: tuple[tuple[str, Any], ...] = ()) -> Registries:
    """Load plugins and build the registries in one call."""
    return build_registries(load_plugins(block=block, extra=extra))
