"""How config problems are reported: one :class:`ConfigError` holding every
``(path, message)`` found, so a user fixes everything in one pass."""

from __future__ import annotations

from typing import Any

from forge_core.api import ForgeError


class ConfigError(ForgeError):
    """Every problem found in a config, one ``(path, message)`` per line."""

    def __init__(self, issues: list[tuple[str, str]]):
        self.issues = issues
        super().__init__("\n".join(f"error: {path}: {message}" for path, message in issues))


def type_name(value: Any) -> str:
    """The YAML-facing name of ``value``'s type, for messages (``null``, ``str``, ...)."""
    return "null" if value is None else type(value).__name__
