"""The plugin manager: built-ins and third-party packages, found the same way.

Every plugin is a module (or object) registered with pluggy under an explicit name. The
built-ins are entry points of the ``forge-trainer`` distribution in the group ``forge``;
third-party packages declare entry points in the same group. Switches control loading:

- ``FORGE_DISABLE_PLUGIN_AUTOLOAD=1`` loads only the built-ins, and the third-party
  plugins named in ``FORGE_PLUGINS=name,name`` (pytest's ``PYTEST_PLUGINS`` with its
  autoload switched off): a set of plugins that does not depend on what else is
  installed, for a test suite or for finding which plugin breaks a run;
- ``FORGE_BLOCK_PLUGINS=name,name`` and the config's ``plugins.block`` skip plugins by
  name (the entry-point name, as ``forge-run plugins`` shows it); a name no installed
  plugin has blocks nothing and is a warning with a did-you-mean;
- a plugin whose import raises (anything: an exception, ``sys.exit``, a
  ``KeyboardInterrupt`` of its own), or whose hook implementation does not fit the
  hook's signature, stops loading with a message naming the entry point, its
  distribution and the way to block it, instead of a bare traceback or a silent exit.
  A ``KeyboardInterrupt`` counts as the plugin's own only when no SIGINT arrived while
  its code ran (:func:`call_plugin`): the user's Ctrl-C during start-up still reads as
  an interrupt.

What loading finds wrong but need not stop for (a function named like a hook but not
marked with ``@hookimpl``, which pluggy silently skips; a blocked name no plugin has)
is kept as warnings (:attr:`LoadedPlugins.warnings`), reported by ``check``, ``train``
and ``plugins``.

The kernel's own rules (:data:`KERNEL_PLUGINS`) are registered by the kernel itself, not
found through an entry point: no config, environment variable or installed package can
block or replace them, so the safety rules always run.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import Any, TypeVar

import attrs
import pluggy

from forge_core import hookspecs
from forge_core.api import ForgeError
from forge_core.api.hooks import PROJECT
from forge_core.api.unstable import Violation, did_you_mean
from forge_core.errors import Interrupted

T = TypeVar("T")

ENTRY_POINT_GROUP = "forge"
BUILTIN_DISTRIBUTION = "forge-trainer"
AUTOLOAD_ENV = "FORGE_DISABLE_PLUGIN_AUTOLOAD"
BLOCK_ENV = "FORGE_BLOCK_PLUGINS"
ONLY_ENV = "FORGE_PLUGINS"

#: Plugins of the kernel itself: registered first, from these modules, whatever is
#: installed; they cannot be blocked and their names cannot be taken.
KERNEL_PLUGINS = {"core_rules": "forge_core.core_rules"}

HOOK_NAMES = frozenset(
    name for name in dir(hookspecs) if name.startswith("forge_") and callable(getattr(hookspecs, name))
)

#: Warnings of the plugin loader, reported like rule violations (``plugin`` is the
#: plugin concerned, or the kernel's for a blocked name that matches none).
UNMARKED_HOOK = "plugins.hook-not-marked"
BLOCK_MATCHES_NOTHING = "plugins.block-matches-no-plugin"
NAMED_NOT_INSTALLED = "plugins.named-plugin-not-installed"


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
    warnings: tuple[Violation, ...] = ()

    @property
    def hook(self) -> Any:
        return self.pm.hook


def _env_names(variable: str) -> list[str]:
    return [name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()]


def env_blocklist() -> list[str]:
    return _env_names(BLOCK_ENV)


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


def check_hook_names(plugin: Any, plugin_name: str, dist: str = "") -> list[Violation]:
    """Reject a plugin that marks a function as a hookimpl under a name no hookspec has,
    or with an argument its hookspec does not pass. ``dist`` is ``"name version"`` of
    the distribution it comes from, when known. Returns the warnings for its functions
    named like hooks that are not marked (:func:`_unmarked_hooks`)."""
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
    return _unmarked_hooks(plugin, plugin_name, where)


def _defined_by(plugin: Any, value: Any) -> bool:
    """Whether ``value`` is a function of the plugin itself: defined in its module (not
    imported into it), or a method of its class."""
    if inspect.ismodule(plugin):
        return inspect.isfunction(value) and value.__module__ == plugin.__name__
    return inspect.ismethod(value) or inspect.isfunction(value)


def _unmarked_hooks(plugin: Any, plugin_name: str, where: str) -> list[Violation]:
    """A warning for each ``forge_*`` function of the plugin that is not marked with
    ``@hookimpl``: pluggy registers marked functions only, so such a function is never
    called, and the component or rule it returns is silently missing."""
    module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__qualname__
    found = []
    for attr in dir(plugin):
        value = getattr(plugin, attr, None)
        if (
            not attr.startswith("forge_")
            or hasattr(value, f"{PROJECT}_impl")
            or not _defined_by(plugin, value)
        ):
            continue
        if attr in HOOK_NAMES:
            why = f"is the hook {attr} but is not marked with @hookimpl, so Forge never calls it"
            fix = (
                f"Mark it: `from forge_core.api import hookimpl`, then `@hookimpl` on the line above "
                f"`def {attr}`."
            )
        else:
            why = (
                "is named like a hook but is not marked with @hookimpl and is no hook's name."
                f"{did_you_mean(attr, HOOK_NAMES)}"
            )
            fix = (
                "If it is meant as a hook, give it the hook's name and mark it with @hookimpl (from "
                "forge_core.api); if it is a helper, give it a name that does not start with forge_."
            )
        found.append(
            Violation(
                UNMARKED_HOOK,
                "warning",
                plugin_name,
                f"plugin {plugin_name!r}{where}: {module}.{attr}() {why}",
                fix,
                (),
            )
        )
    return found


def _fix(plugin_name: str, dist: str) -> str:
    package = dist.split()[0] if dist else "the package"
    return (
        f"Fix or uninstall {package}, or skip it with FORGE_BLOCK_PLUGINS={plugin_name} (or "
        f"plugins.block: [{plugin_name}] in the config; FORGE_DISABLE_PLUGIN_AUTOLOAD=1 skips "
        "every third-party plugin)."
    )


def register(pm: pluggy.PluginManager, plugin: Any, name: str, dist: str = "") -> list[Violation]:
    """Register one plugin under an explicit name, validating its hooks first; returns
    the warnings about its hooks."""
    warnings = check_hook_names(plugin, name, dist)
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
    return warnings


class PluginRaised(Exception):
    """What plugin code raised (``original``), any BaseException but the user's Ctrl-C;
    ``shown`` is ``RuntimeError: boom`` (the type alone when there is no message)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original
        self.shown = f"{type(original).__name__}: {original}" if str(original) else type(original).__name__

    def what(self) -> str:
        """``called sys.exit(3)``, ``raised KeyboardInterrupt itself ...``, or
        ``raised RuntimeError: boom``."""
        if isinstance(self.original, SystemExit):
            return f"called sys.exit({self.original.code!r})"
        if isinstance(self.original, KeyboardInterrupt):
            return "raised KeyboardInterrupt itself (no Ctrl-C or SIGINT arrived meanwhile)"
        return f"raised {self.shown}"


@contextlib.contextmanager
def _sigint_watch() -> Iterator[list[int]]:
    """Record each SIGINT that arrives, passing it on to the handler installed before
    (Forge's stop handler, Python's default one raising KeyboardInterrupt)."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received  # signals reach the main thread only
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, previous)


def call_plugin(fn: Callable[[], T]) -> T:
    """``fn()``: plugin code (its import, a registration hook). Whatever it raises
    becomes :class:`PluginRaised`, except an interrupt the user sent: a KeyboardInterrupt
    while a SIGINT arrived, and Forge's own :class:`~forge_core.errors.Interrupted`.
    A KeyboardInterrupt with no SIGINT was raised by the plugin's code itself: treating
    it as the user's would end the command with 130 and no word of which plugin did it."""
    with _sigint_watch() as received:
        try:
            return fn()
        except Interrupted:
            raise
        except KeyboardInterrupt as exc:
            if received:
                raise
            raise PluginRaised(exc) from None
        except BaseException as exc:  # SystemExit, GeneratorExit, ... from plugin code
            raise PluginRaised(exc) from exc


def _import_plugin(ep: metadata.EntryPoint, dist: str) -> Any:
    try:
        return call_plugin(ep.load)
    except PluginRaised as fault:
        exc = fault.original
        what = (
            f"failed to import: {fault.shown}"
            if isinstance(exc, Exception)
            else f"{fault.what()} while being imported"
        )
        raise ForgeError(
            f"plugin {ep.name!r} (entry point '{ep.name} = {ep.value}' in group "
            f"{ENTRY_POINT_GROUP!r} of distribution {dist}) {what}. {_fix(ep.name, dist)}"
        ) from (exc if isinstance(exc, Exception) else None)


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


def _unmatched(
    rule_id: str, source: str, names: set[str], seen: set[str], effect: str, fix: str, fields: tuple = ()
) -> list[Violation]:
    """A warning for each name in ``source`` (a switch naming plugins) that no installed
    plugin has: a misspelled block leaves the plugin meant loaded without a word."""
    return [
        Violation(
            rule_id,
            "warning",
            next(iter(KERNEL_PLUGINS)),  # the kernel's own check
            f"{source} names {name!r}, but no installed plugin has that name, so it {effect}."
            f"{did_you_mean(name, seen)}",
            f"Name plugins as `forge-run plugins` shows them (installed: {', '.join(sorted(seen))}), "
            f"or {fix}.",
            fields,
        )
        for name in sorted(names - seen)
    ]


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
    warnings: list[Violation] = []
    seen_names: set[str] = set()
    skip_third_party, wanted = _autoload_disabled(), set(_env_names(ONLY_ENV))
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
        if ep.name in blocked or (skip_third_party and not builtin and ep.name not in wanted):
            continue
        if ep.name in infos:
            other = infos[ep.name]
            keep = "the built-in one" if other.builtin or builtin else "the one you want"
            raise ForgeError(
                f"two plugins are named {ep.name!r}: one from {other.distribution}, one from "
                f"{dist_name}. Uninstall one of the distributions (keeping {keep}) or ask its "
                "authors to rename the entry point; blocking the name would skip both."
            )
        warnings += register(pm, _import_plugin(ep, dist), ep.name, dist)
        infos[ep.name] = PluginInfo(ep.name, dist_name, version, ep.value, builtin)
    for name, plugin in extra:
        seen_names.add(name)
        if name in blocked:
            continue
        warnings += register(pm, plugin, name)
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
        warnings=(
            *warnings,
            *_unmatched(
                BLOCK_MATCHES_NOTHING,
                "plugins.block",
                config_block,
                seen_names,
                "blocks nothing",
                "remove it from plugins.block",
                (("plugins.block", sorted(config_block)),),
            ),
            *_unmatched(
                BLOCK_MATCHES_NOTHING,
                BLOCK_ENV,
                env_block,
                seen_names,
                "blocks nothing",
                f"remove it from {BLOCK_ENV}",
            ),
            *_unmatched(
                NAMED_NOT_INSTALLED,
                ONLY_ENV,
                wanted,
                seen_names,
                "loads nothing",
                "install the distribution that provides it",
            ),
        ),
    )
