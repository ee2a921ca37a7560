"""What a compatibility rule is and what it sees.

A :class:`Rule` is declared by the plugin whose limit it describes; its ``check`` is
called with the :class:`Plan` of a config (the resolved config, the chosen specs, the
active strategies and degrees) and returns what is wrong. The engine that evaluates
every rule and renders the report is :mod:`forge_core.rules`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Literal

import attrs

Severity = Literal["error", "warning"]


@attrs.frozen
class Rule:
    """A compatibility rule.

    ``check(plan)`` returns ``None`` (or an empty list) when the config is fine, otherwise
    a message, or a list of messages, saying what is wrong and why. ``paths`` are the
    config fields the rule is about (``"parallel.pp"``); the report shows their values.
    """

    id: str
    severity: Severity = attrs.field(validator=attrs.validators.in_(("error", "warning")))
    paths: tuple[str, ...] = attrs.field(converter=tuple)
    summary: str
    check: Callable[[Plan], None | str | Iterable[str]]
    fix: str


@attrs.frozen
class Plan:
    """A judged config: what every rule sees, and what the run builds.

    - ``config``: the resolved :class:`~forge_core.config.schema.ForgeConfig`; option
      blocks are instances of the chosen components' options classes.
    - ``specs``: the chosen spec per kind (``"model"``, ``"attention"``, ``"source"``,
      ``"tokenizer"``, ``"packer"``, ``"optimizer"``, ``"schedule"``).
    - ``strategies``: the active parallelism specs, in the order they are applied.
    - ``degrees``: ``parallel.*`` degrees with ``dp_shard: -1`` resolved (left at -1
      when the world size is unknown).
    - ``world_size``: from ``--world-size`` or the torchrun environment, else ``None``.
    - ``emitted``: the per-token metadata the chosen packer emits under its options.
    - ``facts``: the model's :class:`~forge_core.api.ModelFacts` under its options
      (``ModelSpec.facts``), or ``None`` when the model declares none.
    """

    config: Any
    specs: dict[str, Any]
    strategies: tuple[Any, ...] = ()
    degrees: dict[str, int] = attrs.field(factory=dict)
    world_size: int | None = None
    emitted: frozenset[str] = frozenset()
    facts: Any = None

    def get(self, path: str) -> Any:
        return get_path(self.config, path)


@attrs.frozen
class Violation:
    """One finding of one rule: which rule, its severity, the plugin that declared it,
    what is wrong, the fix, and the config fields the rule names with their values."""

    rule_id: str
    severity: Severity
    plugin: str
    message: str
    fix: str
    fields: tuple[tuple[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule_id,
            "severity": self.severity,
            "plugin": self.plugin,
            "message": self.message,
            "fix": self.fix,
            "fields": {path: _jsonable(value) for path, value in self.fields},
        }


_MISSING = object()


def get_path(obj: Any, path: str, default: Any = _MISSING) -> Any:
    """Read ``"a.b.c"`` from nested attrs objects and mappings."""
    for part in path.split("."):
        if isinstance(obj, dict):
            if part not in obj:
                if default is _MISSING:
                    raise KeyError(path)
                return default
            obj = obj[part]
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        elif default is not _MISSING:
            return default
        else:
            raise KeyError(path)
    return obj


def _jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return attrs.asdict(value)
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)
