"""How the CLI reports a :class:`~forge_core.api.ForgeError`: the message is the whole
story, so it is printed without a traceback and the command exits 2.

``ForgeError``, ``did_you_mean``, ``unknown_name`` and ``show_value`` moved to
:mod:`forge_core.api`; the old names here warn for one release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge_core.deprecation import moved

if TYPE_CHECKING:
    from forge_core.api.errors import ForgeError

EXIT_INVALID = 2


def format_error(exc: ForgeError) -> str:
    """The message as printed: every line of a config report already starts ``error:``."""
    message = str(exc)
    return message if message.startswith("error") else f"error: {message}"


__getattr__ = moved(__name__, {
    name: "forge_core.api" for name in ("ForgeError", "did_you_mean", "unknown_name", "show_value")
} | {"VALUE_WIDTH": "forge_core.api.errors"})
