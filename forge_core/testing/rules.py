"""Conformance check for compatibility rules: the rule fires on a config that breaks it
and stays silent on one that does not.

Each config is judged exactly as ``forge-run check`` would (load, overrides, component
option blocks, rule context with the chosen specs, active strategies and emitted
metadata), with the author's plugins registered in process through ``extra_plugins`` or
found through their installed entry points. The rule under test is then called on that
context directly, so a rule object that is not registered anywhere can be checked too.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from forge_core.api import Plan, Rule

if TYPE_CHECKING:
    from forge_core.registry import Registries

#: A config given to :func:`check_rule`: a mapping (written to a temporary YAML file), a
#: path, or ``(mapping or path, ["section.key=value", ...])``.
ConfigCase = Any


def check_rule(
    rule: Rule | str,
    *,
    violating: ConfigCase | list[ConfigCase],
    passing: ConfigCase | list[ConfigCase],
    extra_plugins: Iterable[tuple[str, Any]] = (),
    world_size: int | None = None,
) -> list[str]:
    """Check that ``rule`` reports every ``violating`` config and none of the
    ``passing`` ones; raise AssertionError naming the rule and the config otherwise.

    ``rule`` is a :class:`~forge_core.api.Rule` or the id of a registered rule. A
    config is a mapping (a partial config: defaults fill the rest), a YAML path, or a
    ``(mapping or path, overrides)`` pair; a list checks several. Every config must load
    (a config error is reported, not counted as the rule firing), and a rule that raises
    fails the check. Also checked: the rule's fields exist in the config schema and its
    summary and fix are not empty. Returns the messages the rule gave on the violating
    configs, for further assertions.
    """
    extra_plugins = tuple(extra_plugins)
    violating_cases = violating if isinstance(violating, list) else [violating]
    passing_cases = passing if isinstance(passing, list) else [passing]
    if not violating_cases or not passing_cases:
        raise ValueError("check_rule needs at least one violating and one passing config")
    messages: list[str] = []
    with tempfile.TemporaryDirectory(prefix="forge-rule-check-") as tmp:
        for n, case in enumerate(violating_cases + passing_cases):
            expect_fire = n < len(violating_cases)
            judgement, label = _judge(case, Path(tmp) / f"config{n}.yaml", extra_plugins, world_size)
            ctx = judgement.plan
            target = _find_rule(rule, judgement.registries)
            where = f"rule {target.id!r} on the {'violating' if expect_fire else 'passing'} config {label}"
            if n == 0:
                _check_declaration(target, ctx)
            found = _messages(target, ctx, where)
            if expect_fire and not found:
                raise AssertionError(f"{where}: the rule did not fire; it must report this config")
            if not expect_fire and found:
                raise AssertionError(f"{where}: the rule fired although the config is fine: {found[0]}")
            messages.extend(found)
    return messages


def _judge(case: ConfigCase, scratch: Path, extra_plugins: tuple, world_size: int | None) -> tuple[Any, str]:
    from forge_core.judge import judge

    overrides: list[str] = []
    if isinstance(case, tuple):
        if len(case) != 2:
            raise ValueError(f"a config case tuple is (mapping or path, overrides), got {case!r}")
        case, overrides = case[0], list(case[1])
    if isinstance(case, dict):
        scratch.write_text(yaml.safe_dump(case, sort_keys=False))
        path, label = str(scratch), yaml.safe_dump(case, default_flow_style=True, sort_keys=False).strip()
    elif isinstance(case, (str, os.PathLike)):
        path, label = str(case), repr(str(case))
    else:
        raise ValueError(f"a config case is a mapping, a path or (mapping or path, overrides); got {case!r}")
    if overrides:
        label += " with " + " ".join(overrides)
    try:
        judgement = judge(path, overrides, world_size=world_size, extra_plugins=extra_plugins)
    except Exception as exc:  # ConfigError or ForgeError: the case itself is wrong
        raise AssertionError(
            f"config {label} does not load, so no rule can be judged on it:\n{exc}"
        ) from None
    return judgement, label


def _find_rule(rule: Rule | str, registries: Registries) -> Rule:
    if isinstance(rule, Rule):
        return rule
    if not isinstance(rule, str):
        raise ValueError(f"rule must be a Rule or a rule id, got {rule!r}")
    entries = {entry.rule.id: entry.rule for entry in registries.rules}
    if rule not in entries:
        from forge_core.api.unstable import did_you_mean

        raise ValueError(f"no registered rule has id {rule!r}.{did_you_mean(rule, entries)}")
    return entries[rule]


def _check_declaration(rule: Rule, ctx: Plan) -> None:
    for path in ctx.expand_paths(rule.paths):
        try:
            ctx.get(path)
        except KeyError:
            raise AssertionError(
                f"rule {rule.id!r} names the field {path!r}, which the config does not have "
                f"(reports would show it as <unset>)"
            ) from None
    for name in ("summary", "fix"):
        if not str(getattr(rule, name)).strip():
            raise AssertionError(
                f"rule {rule.id!r} has an empty {name}; say what the rule is about and how to fix a violation"
            )


def _messages(rule: Rule, ctx: Plan, where: str) -> list[str]:
    try:
        result = rule.check(ctx)
    except Exception as exc:
        raise AssertionError(f"{where}: the rule raised {type(exc).__name__}: {exc}") from exc
    found = [result] if isinstance(result, str) else list(result or [])
    for message in found:
        if not isinstance(message, str) or not message.strip():
            raise AssertionError(
                f"{where}: the rule returned {message!r}; every message must be a non-empty string"
            )
    return found
