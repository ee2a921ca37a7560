"""How config problems are reported: one :class:`ConfigError` holding every
``(path, message)`` found, so a user fixes everything in one pass."""

from __future__ import annotations

from typing import Any

from forge_core.api import ForgeError

#: Most problems a :class:`ConfigError`'s message lists; the others are counted. A
#: config can be wrong in a hundred thousand places, and no one reads past the first few.
MAX_REPORTED = 50


class ConfigError(ForgeError):
    """Every problem found in a config, one ``(path, message)`` per line (the first
    :data:`MAX_REPORTED` of them; ``issues`` holds them all)."""

    def __init__(self, issues: list[tuple[str, str]]):
        self.issues = issues
        lines = [f"error: {path}: {message}" for path, message in issues[:MAX_REPORTED]]
        if len(issues) > MAX_REPORTED:
            lines.append(
                f"error: and {len(issues) - MAX_REPORTED:,} more problems; fix these first and run "
                "`forge-run check` again"
            )
        super().__init__("\n".join(lines))


def type_name(value: Any) -> str:
    """The YAML-facing name of ``value``'s type, for messages (``null``, ``str``, ...)."""
    return "null" if value is None else type(value).__name__
