"""The metrics plugins add to a step (the ``forge_step_metrics`` hook), checked.

Each implementation is called on its own, not through pluggy's hook call, so that every
metric is attributed to the plugin that returned it: a name Forge already reports, or
one two plugins both return, is an error naming whose it is, rather than one silently
overwriting the other.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from forge_core.api import ForgeError

HOOK = "forge_step_metrics"


def _number(plugin: str, name: str, value: Any) -> int | float | bool:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, numbers.Real):  # a NumPy scalar: JSON and the trackers want a float
        return float(value)
    hint = " (a tensor: return value.item())" if hasattr(value, "item") else ""
    raise ForgeError(
        f"plugin {plugin!r}: {HOOK}() returned {name!r} = {value!r} ({type(value).__name__}); a "
        f"metric is an int, a float or a bool{hint}."
    )


def collect(pm: Any, run: Any, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    """What every implementation of ``forge_step_metrics`` adds to ``metrics`` at ``step``."""
    args = {"run": run, "step": step, "metrics": MappingProxyType(metrics)}
    added: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for impl in getattr(pm.hook, HOOK).get_hookimpls():
        result = impl.function(*[args[a] for a in impl.argnames])
        if result is None:
            continue
        plugin = impl.plugin_name
        if not isinstance(result, Mapping):
            raise ForgeError(
                f"plugin {plugin!r}: {HOOK}() must return a dict of metric name to number, or "
                f"None; it returned {type(result).__name__}."
            )
        for name, value in result.items():
            if not isinstance(name, str) or not name.strip():
                raise ForgeError(f"plugin {plugin!r}: {HOOK}() returned a metric named {name!r}; use a str.")
            if name in metrics:
                raise ForgeError(
                    f"plugin {plugin!r}: {HOOK}() returned {name!r}, a metric Forge already "
                    f"reports. Give it a name of its own, prefixed with the plugin's: "
                    f"'{plugin.removeprefix('logger.')}/{name}'."
                )
            if name in owner:
                raise ForgeError(
                    f"plugins {owner[name]!r} and {plugin!r} both return the metric {name!r} from "
                    f"{HOOK}(). Rename one (prefix it with its plugin's name) or disable the other."
                )
            owner[name] = plugin
            added[name] = _number(plugin, name, value)
    return added
