"""Old import paths that keep working for one release, with a ``DeprecationWarning``
naming the new one.

A module whose names moved defines ``__getattr__ = moved(__name__, {...})``: the real
attribute is gone from the module, so every use of the old path goes through here and
warns, and nothing inside Forge can keep using it unnoticed (the test suite imports
every module with deprecation warnings as errors).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: ``names`` maps each old name to its new
    home, ``"package.module"`` (same name) or ``"package.module:new_name"``."""

    def __getattr__(name: str) -> Any:
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new_module, _, new_name = target.partition(":")
        new_name = new_name or name
        renamed = "" if new_name == name else f" ({name} is now called {new_name})"
        warnings.warn(
            f"{module}.{name} is deprecated and will be removed in the next release: use "
            f"`from {new_module} import {new_name}`{renamed}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__
