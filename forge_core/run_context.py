"""Deprecated location of :class:`RunContext`: import it from :mod:`forge_core.api`.

Kept for one release; the name warns and names its new home."""

from forge_core.deprecation import moved

__getattr__ = moved(__name__, {"RunContext": "forge_core.api"})
