"""How the commands print rule violations: the report ``forge-run check`` shows, and
``forge-run train`` refuses a config with."""

from __future__ import annotations

from collections.abc import Iterable

from forge_core.api.errors import show_value
from forge_core.api.unstable import Violation


def render(violations: Iterable[Violation]) -> str:
    """Human-readable report, errors first."""
    ordered = sorted(violations, key=lambda v: (v.severity != "error", v.rule_id))
    blocks = []
    for v in ordered:
        fields = ", ".join(f"$.{path} = {show_value(value)}" for path, value in v.fields)
        blocks.append(
            f"{v.severity}: [{v.rule_id}] (plugin {v.plugin!r})\n"
            + (f"  fields: {fields}\n" if fields else "")  # an environment variable has no field
            + f"  why:    {v.message}\n"
            f"  fix:    {v.fix}"
        )
    return "\n".join(blocks)
