"""The plugin manager: built-ins and third-party packages, found the same way.

Every plugin is a module (or object) registered with pluggy under an explicit name. The
built-ins are entry points of the ``forge-trainer`` distribution in the group ``forge``;
third-party packages declare entry points in the same group. Three switches control
loading:

- ``FORGE_DISABLE_PLUGIN_AUTOLOAD=1`` loads only the built-ins;
- ``FORGE_BLOCK_PLUGINS=name,name`` and the config's ``plugins.block`` skip plugins by
  name (the entry-point name, as ``forge-run plugins`` shows it);
- a plugin whose import raises (or calls ``sys.exit``), or whose hook implementation
  does not fit the hook's signature, stops loading with a message naming the entry
  point, its distribution and the way to block it, instead of a bare traceback.

The kernel's own rules (:data:`KERNEL_PLUGINS`) are registered by the kernel itself, not
found through an entry point: no config, environment variable or installed package can
block or replace them, so the safety rules always run.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Iterable
from importlib import metadata
from typing import Any

import attrs
import pluggy

from forge_core import hookspecs
from forge_core.api import ForgeError, did_you_mean
from forge_core.api.hooks import PROJECT

ENTRY_POINT_GROUP = "forge"
BUILTIN_DISTRIBUTION = "forge-trainer"
AUTOLOAD_ENV = "FORGE_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "FORGE_BLOCK_PLUGINS"

#: Plugins of the kernel itself: registered first, from these modules, whatever is
#: installed; they cannot be blocked and their names cannot be taken.
KERNEL_PLUGINS = {"core_rules": "forge_core.core_rules"}

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
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def check_hook_names(plugin: Any, plugin_name: str, dist: str = "") -> None:
    """Reject a plugin that marks a function as a hookimpl under a name no hookspec has,
    or with an argument its hookspec does not pass. ``dist`` is ``"name version"`` of
    the distribution it comes from, when known."""
    where = f" (distribution {dist})" if dist else ""
    for attr in dir(plugin):
        value = getattr(plugin, attr, None)
        if value is None or not hasattr(value, f"{PROJECT}_impl"):
            continue
        if attr not in HOOK_NAMES:
            raise ForgeError(
                f"plugin {plugin_name!r}{where} implements unknown hook {attr!r}."
                f"{did_you_mean(attr, HOOK_NAMES)} Known hooks: {', '.join(sorted(HOOK_NAMES))}."
            )
        offered = list(inspect.signature(getattr(hookspecs, attr)).parameters)
        try:
            parameters = inspect.signature(value).parameters.values()
        except (TypeError, ValueError):
            continue  # pluggy will judge what inspect cannot read
        # What pluggy passes by name: parameters without a default, not *args/**kwargs.
        wanted = [
            p.name
            for p in parameters
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        unknown = [name for name in wanted if name not in offered]
        if unknown:
            raise ForgeError(
                f"plugin {plugin_name!r}{where}: its {attr}() takes {', '.join(map(repr, unknown))}, "
                f"which the hook does not pass (it passes: {', '.join(offered) or 'nothing'}). "
                f"{_fix(plugin_name, dist)}"
            )


def _fix(plugin_name: str, dist: str) -> str:
    package = dist.split()[0] if dist else "the package"
    return (
        f"Fix or uninstall {package}, or skip it with FORGE_BLOCK_PLUGINS={plugin_name} (or "
        f"plugins.block: [{plugin_name}] in the config; FORGE_DISABLE_PLUGIN_AUTOLOAD=1 skips "
        "every third-party plugin)."
    )


def register(pm: pluggy.PluginManager, plugin: Any, name: str, dist: str = "") -> None:
    """Register one plugin under an explicit name, validating its hooks first."""
    check_hook_names(plugin, name, dist)
    if pm.get_plugin(name) is not None:
        raise ForgeError(f"two plugins are named {name!r}; rename one of the entry points.")
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        detail = " ".join(str(exc).split())
        where = f" (distribution {dist})" if dist else ""
        raise ForgeError(
            f"plugin {name!r}{where} does not fit the hook contract: {detail}. {_fix(name, dist)}"
        ) from None


def _import_plugin(ep: metadata.EntryPoint, dist: str) -> Any:
    try:
        return ep.load()
    except (Exception, SystemExit) as exc:  # SystemExit: sys.exit() at import time
        what = (
            f"called sys.exit({exc.code!r}) while being imported"
            if isinstance(exc, SystemExit)
            else f"failed to import: {type(exc).__name__}: {exc}"
        )
        raise ForgeError(
            f"plugin {ep.name!r} (entry point '{ep.name} = {ep.value}' in group "
            f"{ENTRY_POINT_GROUP!r} of distribution {dist}) {what}. {_fix(ep.name, dist)}"
        ) from (None if isinstance(exc, SystemExit) else exc)


def _refuse_kernel_blocks(config_block: set[str], env_block: set[str]) -> None:
    for source, names in (("plugins.block in the config", config_block), (f"{BLOCK_ENV}", env_block)):
        kernel = sorted(names & KERNEL_PLUGINS.keys())
        if kernel:
            raise ForgeError(
                f"{source} names {', '.join(map(repr, kernel))}: the kernel's compatibility rules "
                "(world size, metadata reaching every layer, attention honouring document ids, "
                "...) cannot be switched off; without them a config that trains silently wrong "
                f"would pass. Remove {', '.join(kernel)} from {source}. To drop a plugin's rules, "
                "block that plugin (its components go with its rules)."
            )


def _kernel_plugins(pm: pluggy.PluginManager) -> dict[str, PluginInfo]:
    from forge_core import __version__

    infos = {}
    for name, module in KERNEL_PLUGINS.items():
        register(pm, importlib.import_module(module), name)
        infos[name] = PluginInfo(name, BUILTIN_DISTRIBUTION, __version__, module, True)
    return infos


def load_plugins(block: Iterable[str] = (), extra: Iterable[tuple[str, Any]] = ()) -> LoadedPlugins:
    """Load the kernel's plugins, then built-in and third-party plugins from the
    ``forge`` entry-point group.

    ``block`` (the config's ``plugins.block``) and ``FORGE_BLOCK_PLUGINS`` name plugins to
    skip (never a kernel plugin); ``extra`` registers ``(name, plugin)`` pairs directly
    (tests, embedding).
    """
    config_block, env_block = set(block), set(env_blocklist())
    _refuse_kernel_blocks(config_block, env_block)
    blocked = config_block | env_block
    pm = new_plugin_manager()
    infos = _kernel_plugins(pm)
    seen_names: set[str] = set()
    skip_third_party = _autoload_disabled()
    for ep in _entry_points():
        dist_name, version = _distribution(ep)
        builtin = dist_name == BUILTIN_DISTRIBUTION
        dist = f"{dist_name} {version}"
        if ep.name in KERNEL_PLUGINS:
            if builtin:
                continue  # the kernel registered it already
            raise ForgeError(
                f"distribution {dist} declares a plugin named {ep.name!r} (entry point "
                f"'{ep.name} = {ep.value}'), a name reserved for the kernel's own rules. Uninstall "
                f"it (pip uninstall {dist_name}) or ask its authors to rename the entry point."
            )
        seen_names.add(ep.name)
        if ep.name in blocked or (skip_third_party and not builtin):
            continue
        if ep.name in infos:
            other = infos[ep.name]
            keep = "the built-in one" if other.builtin or builtin else "the one you want"
            raise ForgeError(
                f"two plugins are named {ep.name!r}: one from {other.distribution}, one from "
                f"{dist_name}. Uninstall one of the distributions (keeping {keep}) or ask its "
                "authors to rename the entry point; blocking the name would skip both."
            )
        register(pm, _import_plugin(ep, dist), ep.name, dist)
        infos[ep.name] = PluginInfo(ep.name, dist_name, version, ep.value, builtin)
    for name, plugin in extra:
        seen_names.add(name)
        if name in blocked:
            continue
        register(pm, plugin, name)
        module = getattr(plugin, "__name__", type(plugin).__name__)
        infos[name] = PluginInfo(name, "<registered in process>", "", module, False)
    if not any(info.builtin and name not in KERNEL_PLUGINS for name, info in infos.items()) and not blocked:
        raise ForgeError(
            "no built-in plugins found: the forge-trainer distribution is not installed. "
            "Install it with: pip install -e ."
        )
    return LoadedPlugins(
        pm=pm,
        infos=infos,
        blocked=tuple(sorted(blocked & seen_names)),
    )
