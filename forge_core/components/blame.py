"""Which component failed: plugin failures named by the component and the plugin that
registered it.

:func:`describe` names a component (``tokenizer 'hf' (plugin 'tokenizers')``),
:func:`original_error` quotes what it raised, and :func:`culprit` finds, from an
exception's traceback, the component whose code raised it while the run used it.
"""

from __future__ import annotations

import inspect
from typing import Any

#: Longest original message quoted in a ComponentError.
_MAX_MESSAGE = 1000


def describe(registries: Any, kind: str, name: str) -> str:
    """``tokenizer 'hf' (plugin 'tokenizers')``."""
    registry = registries[kind]
    return f"{registry.kind.label} {name!r} (plugin {registry.plugin_of(name)!r})"


def original_error(exc: BaseException) -> str:
    text = str(exc)
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + " ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_kernel(module: str) -> bool:
    return module == "forge_core" or module.startswith("forge_core.")


def culprit(exc: BaseException, registries: Any) -> str | None:
    """Which plugin code raised ``exc``: ``"model 'llama' (plugin 'models')"``, or
    ``"plugin 'observer'"`` when the code belongs to a plugin but to none of its
    components, or ``None`` when no plugin code is on the traceback.

    The innermost frame in a plugin's package names the plugin. Within it, the innermost
    frame in a component's implementation (its function or class, else its module when
    no other component of the plugin shares it) names the component. The kernel's own
    modules never count."""
    packages: dict[str, str] = {}
    for name, plugin in registries.plugins.pm.list_name_plugin():
        module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
        package = module.rpartition(".")[0] or module
        if not _is_kernel(package):
            packages.setdefault(package, name)
    impls = [
        (
            registry.plugin_of(component),
            *registry.get(component).impl.partition(":")[::2],
            describe(registries, registry.kind.name, component),
        )
        for registry in registries
        for component in registry.names()
    ]
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(
            (str(tb.tb_frame.f_globals.get("__name__", "")), getattr(code, "co_qualname", code.co_name))
        )
        tb = tb.tb_next
    owner = None
    for module, qualname in reversed(frames):
        if _is_kernel(module):
            continue
        plugin = next(
            (p for pkg, p in packages.items() if module == pkg or module.startswith(pkg + ".")), None
        )
        owner = owner or plugin
        if owner is None or plugin != owner:
            continue
        here = [(attr, what) for p, mod, attr, what in impls if p == owner and mod == module]
        exact = [what for attr, what in here if qualname == attr or qualname.startswith(attr + ".")]
        if exact or len(here) == 1:
            return (exact or [here[0][1]])[0]
    return None if owner is None else f"plugin {owner!r}"
