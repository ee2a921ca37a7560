"""The compatibility-rule engine: judge a config before anything is built.

A :class:`Rule` is declared by the plugin whose limit it describes. The engine evaluates
every rule over a :class:`RuleContext` and reports every :class:`Violation` at once, each
naming the rule, the declaring plugin, the config fields with their values, why, and how
to fix it. Errors stop a run before any process group or tensor exists; warnings are
printed and the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Literal

import attrs

from forge_core.errors import show_value

Severity = Literal["error", "warning"]


@attrs.frozen
class Rule:
    """A compatibility rule.

    ``check(ctx)`` returns ``None`` (or an empty list) when the config is fine, otherwise
    a message, or a list of messages, saying what is wrong and why. ``paths`` are the
    config fields the rule is about (``"parallel.pp"``); the report shows their values.
    """

    id: str
    severity: Severity = attrs.field(validator=attrs.validators.in_(("error", "warning")))
    paths: tuple[str, ...] = attrs.field(converter=tuple)
    summary: str
    check: Callable[[RuleContext], None | str | Iterable[str]]
    fix: str


@attrs.frozen
class RuleContext:
    """What a rule sees.

    - ``config``: the resolved :class:`~forge_core.config.schema.ForgeConfig`; option
      blocks are instances of the chosen components' options classes.
    - ``specs``: the chosen spec per kind (``"model"``, ``"attention"``, ``"source"``,
      ``"tokenizer"``, ``"packer"``, ``"optimizer"``, ``"schedule"``).
    - ``strategies``: the active parallelism specs, in the order they are applied.
    - ``degrees``: ``parallel.*`` degrees with ``dp_shard: -1`` resolved (left at -1
      when the world size is unknown).
    - ``world_size``: from ``--world-size`` or the torchrun environment, else ``None``.
    - ``emitted``: the per-token metadata the chosen packer emits under its options.
    """

    config: Any
    specs: dict[str, Any]
    strategies: tuple[Any, ...] = ()
    degrees: dict[str, int] = attrs.field(factory=dict)
    world_size: int | None = None
    emitted: frozenset[str] = frozenset()

    def get(self, path: str) -> Any:
        return get_path(self.config, path)


@attrs.frozen
class Violation:
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


def evaluate(rules: Iterable[Any], ctx: RuleContext) -> list[Violation]:
    """Evaluate every rule (``RuleEntry`` objects: ``.rule`` and ``.plugin``); a rule that
    raises is itself reported as an error naming its plugin."""
    violations: list[Violation] = []
    for entry in rules:
        rule = entry.rule
        fields = tuple((path, get_path(ctx.config, path, "<unset>")) for path in rule.paths)
        try:
            result = rule.check(ctx)
        except (Exception, SystemExit) as exc:  # a rule must not end the process either
            fix = (
                "report this as a bug in Forge (kernel rules cannot be blocked)"
                if getattr(entry, "kernel", False)
                else f"report this to the authors of plugin {entry.plugin!r}, or block it with "
                f"FORGE_BLOCK_PLUGINS={entry.plugin} (its components and rules go with it)"
            )
            violations.append(
                Violation(rule.id, "error", entry.plugin,
                          f"the rule itself failed: {type(exc).__name__}: {exc}", fix, fields)
            )
            continue
        messages = [result] if isinstance(result, str) else list(result or [])
        violations.extend(
            Violation(rule.id, rule.severity, entry.plugin, message, rule.fix, fields)
            for message in messages
        )
    return violations


def render(violations: Iterable[Violation]) -> str:
    """Human-readable report, errors first."""
    ordered = sorted(violations, key=lambda v: (v.severity != "error", v.rule_id))
    blocks = []
    for v in ordered:
        fields = ", ".join(f"$.{path} = {_show(value)}" for path, value in v.fields)
        blocks.append(
            f"{v.severity}: [{v.rule_id}] (plugin {v.plugin!r})\n"
            f"  fields: {fields}\n"
            f"  why:    {v.message}\n"
            f"  fix:    {v.fix}"
        )
    return "\n".join(blocks)


def _show(value: Any) -> str:
    return show_value(value)
