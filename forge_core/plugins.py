"""The plugin manager: built-ins and third-party packages, found the same way.

Every plugin is a module (or object) registered with pluggy under an explicit name. The
built-ins are entry points of the ``forge-trainer`` distribution in the group ``forge``;
third-party packages declare entry points in the same group. Three switches control
loading:

- ``FORGE_DISABLE_PLUGIN_AUTOLOAD=1`` loads only the built-ins;
- ``FORGE_BLOCK_PLUGINS=name,name`` and the config's ``plugins.block`` skip plugins by
  name (the entry-point name, as ``forge-run plugins`` shows it);
- a plugin whose import raises stops loading with a message naming the entry point, its
  distribution and the way to block it, instead of a bare traceback.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import attrs
import pluggy

from forge_core import hookspecs
from forge_core.errors import ForgeError, did_you_mean

ENTRY_POINT_GROUP = "forge"
BUILTIN_DISTRIBUTION = "forge-trainer"
AUTOLOAD_ENV = "FORGE_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "FORGE_BLOCK_PLUGINS"

HOOK_NAMES = frozenset(
    name for name in dir(hookspecs) if name.startswith("forge_") and callable(getattr(hookspecs, name))
)


@attrs.frozen
class PluginInfo:
    """Where a registered plugin came from."""

    name: str
    distribution: str
    version: str
    module: str
    builtin: bool


@attrs.frozen
class LoadedPlugins:
    """The pluggy manager plus what ``forge-run plugins`` reports about each plugin."""

    pm: pluggy.PluginManager
    infos: dict[str, PluginInfo]
    blocked: tuple[str, ...]

    @property
    def hook(self) -> Any:
        return self.pm.hook


def env_blocklist() -> list[str]:
    return [name.strip() for name in os.environ.get(BLOCK_ENV, "").split(",") if name.strip()]


def _autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _entry_points() -> list[metadata.EntryPoint]:
    eps = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    # The same distribution can be visible twice (an editable install plus a build
    # directory on sys.path); keep the first of identical (name, value) pairs.
    seen: set[tuple[str, str]] = set()
    unique = []
    for ep in eps:
        if (ep.name, ep.value) not in seen:
            seen.add((ep.name, ep.value))
            unique.append(ep)
    return unique


def _distribution(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "<unknown distribution>", "?"
    return dist.metadata["Name"] or "<unknown distribution>", dist.version or "?"


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def check_hook_names(plugin: Any, plugin_name: str) -> None:
    """Reject a plugin that marks a function as a hookimpl under a name no hookspec has."""
    for attr in dir(plugin):
        value = getattr(plugin, attr, None)
        if value is None or not hasattr(value, f"{hookspecs.PROJECT}_impl"):
            continue
        if attr not in HOOK_NAMES:
            raise ForgeError(
                f"plugin {plugin_name!r} implements unknown hook {attr!r}."
                f"{did_you_mean(attr, HOOK_NAMES)} Known hooks: {', '.join(sorted(HOOK_NAMES))}."
            )


def register(pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
    """Register one plugin under an explicit name, validating its hook names first."""
    check_hook_names(plugin, name)
    if pm.get_plugin(name) is not None:
        raise ForgeError(f"two plugins are named {name!r}; rename one of the entry points.")
    pm.register(plugin, name=name)


def load_plugins(block: Iterable[str] = (), extra: Iterable[tuple[str, Any]] = ()) -> LoadedPlugins:
    """Load built-in and third-party plugins from the ``forge`` entry-point group.

    ``block`` (the config's ``plugins.block``) and ``FORGE_BLOCK_PLUGINS`` name plugins to
    skip; ``extra`` registers ``(name, plugin)`` pairs directly (tests, embedding).
    """
    blocked = set(block) | set(env_blocklist())
    pm = new_plugin_manager()
    infos: dict[str, PluginInfo] = {}
    seen_names: set[str] = set()
    skip_third_party = _autoload_disabled()
    for ep in _entry_points():
        dist_name, version = _distribution(ep)
        builtin = dist_name == BUILTIN_DISTRIBUTION
        seen_names.add(ep.name)
        if ep.name in blocked or (skip_third_party and not builtin):
            continue
        if ep.name in infos:
            raise ForgeError(
                f"two plugins are named {ep.name!r}: one from {infos[ep.name].distribution}, "
                f"one from {dist_name}. Block one with FORGE_BLOCK_PLUGINS or uninstall it."
            )
        try:
            plugin = ep.load()
        except Exception as exc:
            raise ForgeError(
                f"plugin {ep.name!r} (entry point '{ep.name} = {ep.value}' in group "
                f"{ENTRY_POINT_GROUP!r} of distribution {dist_name} {version}) failed to import: "
                f"{type(exc).__name__}: {exc}. Fix or uninstall {dist_name}, or skip it with "
                f"FORGE_BLOCK_PLUGINS={ep.name} (or plugins.block: [{ep.name}] in the config; "
                f"FORGE_DISABLE_PLUGIN_AUTOLOAD=1 skips every third-party plugin)."
            ) from exc
        register(pm, plugin, ep.name)
        infos[ep.name] = PluginInfo(ep.name, dist_name, version, ep.value, builtin)
    for name, plugin in extra:
        seen_names.add(name)
        if name in blocked:
            continue
        register(pm, plugin, name)
        module = getattr(plugin, "__name__", type(plugin).__name__)
        infos[name] = PluginInfo(name, "<registered in process>", "", module, False)
    if not any(info.builtin for info in infos.values()) and not blocked:
        raise ForgeError(
            "no built-in plugins found: the forge-trainer distribution is not installed. "
            "Install it with: pip install -e ."
        )
    return LoadedPlugins(
        pm=pm,
        infos=infos,
        blocked=tuple(sorted(blocked & seen_names)),
    )
