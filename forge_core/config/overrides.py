"""Edit raw config data before it is structured: dotted ``a.b.c=value`` overrides, and
keys that moved (an error naming the new path in a user's config, migrated in Forge's own)."""

from __future__ import annotations

from typing import Any

from forge_core.api.unstable import show_value
from forge_core.config.errors import ConfigError
from forge_core.config.yaml_reader import MAX_DEPTH, parse_yaml


def plain_copy(value: Any) -> Any:
    """A copy sharing nothing (an alias makes two places hold one object, and an override
    of one must not change the other). Depth is bounded by :data:`MAX_DEPTH`."""
    if isinstance(value, dict):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a copy of ``raw``."""
    result, issues = _overridden(raw, overrides)
    if issues:
        raise ConfigError(issues)
    return result


def _overridden(raw: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``raw`` with every valid override applied, and the problems of the others."""
    result = plain_copy(raw)
    issues = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            issues.append(("$", f"override {show_value(item)} is not of the form section.key=value"))
            continue
        parts = key.split(".")
        if len(parts) > MAX_DEPTH:
            issues.append(
                ("$", f"override key {show_value(key)} is nested more than {MAX_DEPTH} levels deep")
            )
            continue
        try:
            value = parse_yaml(text, f"$.{key}")
        except ConfigError as exc:
            issues.extend(exc.issues)
            continue
        target = result
        for depth, part in enumerate(parts[:-1]):
            nxt = target.setdefault(part, {})
            if nxt is None:
                nxt = target[part] = {}
            if not isinstance(nxt, dict):
                where = "$." + ".".join(parts[: depth + 1])
                issues.append(
                    (where, f"override {show_value(item)} goes inside {where}, which is not a mapping")
                )
                break
            target = nxt
        else:
            target[parts[-1]] = value
    return result, issues


#: Config keys that moved, old path -> new path. An old key (in a file or an override) is
#: an error at its path naming the new one, reported with every other problem.
MOVED_KEYS: dict[str, str] = {
    # Strategy settings moved into the strategy's own option block.
    "parallel.pp_schedule": "parallel.options.pp.schedule",
    "parallel.pp_microbatches": "parallel.options.pp.microbatches",
    "parallel.pp_virtual_stages": "parallel.options.pp.virtual_stages",
    "parallel.sequence_parallel": "parallel.options.tp.sequence_parallel",
}


def _moved_key_issues(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Take every moved key out of ``raw`` (so it is not also reported as unknown) and
    say where it went."""
    issues = []
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        block = raw.get(section)
        if isinstance(block, dict) and key in block:
            value = block.pop(key)
            issues.append(
                (
                    f"$.{old}",
                    f"moved to {new}: set {new} = {show_value(value)} instead "
                    f"(override: {new}={show_value(value)})",
                )
            )
    return issues


def migrate_moved_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with every moved key put at its new path (where that is not set already):
    for configs Forge itself wrote (a run directory's ``config.yaml``), never for a
    user's, whose old keys are errors that name the new path."""
    raw = plain_copy(raw)
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        block = raw.get(section)
        if not isinstance(block, dict) or key not in block:
            continue
        value = block.pop(key)
        *parents, leaf = new.split(".")
        target = raw
        for part in parents:
            if target.get(part) is None:
                target[part] = {}
            if not isinstance(target[part], dict):
                break  # the new place is not a mapping: structuring reports it
            target = target[part]
        else:
            target.setdefault(leaf, value)
    return raw


def with_overrides(raw: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A copy of ``raw`` with the valid overrides applied, and the problems of the other
    overrides and of moved keys, to be reported with the rest."""
    result, issues = _overridden(raw, list(overrides))
    return result, issues + _moved_key_issues(result)
