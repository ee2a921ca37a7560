"""Deprecated location of :class:`ParallelContext`: import it from :mod:`forge_core.api`.

Kept for one release; the name warns and names its new home."""

from forge_core.deprecation import moved

__getattr__ = moved(__name__, {"ParallelContext": "forge_core.api"})
