"""The compatibility-rule engine: judge a config before anything is built.

A :class:`~forge_core.api.Rule` is declared by the plugin whose limit it describes. The
engine evaluates every rule over a :class:`~forge_core.api.Plan` and reports every
:class:`~forge_core.api.unstable.Violation` at once, each naming the rule, the declaring plugin,
the config fields with their values, why, and how to fix it. Errors stop a run before
any process group or tensor exists; warnings are printed and the run goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from forge_core.api.rules import Plan, Violation


def evaluate(rules: Iterable[Any], ctx: Plan) -> list[Violation]:
    """Evaluate every rule (``RuleEntry`` objects: ``.rule`` and ``.plugin``); a rule that
    raises is itself reported as an error naming its plugin."""
    violations: list[Violation] = []
    for entry in rules:
        rule = entry.rule
        fields = tuple((path, ctx.get(path, "<unset>")) for path in ctx.expand_paths(rule.paths))
        try:
            result = rule.check(ctx)
            fix = rule.fix_for(ctx) if result and rule.fix_for is not None else rule.fix
        except (Exception, SystemExit) as exc:  # a rule must not end the process either
            fix = (
                "report this as a bug in Forge (kernel rules cannot be blocked)"
                if getattr(entry, "kernel", False)
                else f"report this to the authors of plugin {entry.plugin!r}, or block it with "
                f"FORGE_BLOCK_PLUGINS={entry.plugin} (its components and rules go with it)"
            )
            violations.append(
                Violation(
                    rule.id,
                    "error",
                    entry.plugin,
                    f"the rule itself failed: {type(exc).__name__}: {exc}",
                    fix,
                    fields,
                )
            )
            continue
        messages = [result] if isinstance(result, str) else list(result or [])
        violations.extend(
            Violation(rule.id, rule.severity, entry.plugin, message, fix, fields) for message in messages
        )
    return violations
