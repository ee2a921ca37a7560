"""User-facing errors and the helpers that word them.

A :class:`ForgeError`'s message is the whole story (what is wrong, the config path and
value, the fix), so the CLI prints it without a traceback and exits with its
``exit_code`` (2).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: The exit status of a command refused for bad input (config, files, a plugin, a component).
EXIT_INVALID = 2


class ForgeError(Exception):
    """An error caused by the user's config, files or plugins, with a fix in its message.
    ``forge-run`` prints the message alone and exits with ``exit_code``."""

    exit_code = EXIT_INVALID


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest choice, or an empty string. A short name
    (``rq`` for ``rp``) is too short for a similarity ratio (one letter off of two is
    0.5), so when nothing is close by ratio the one choice a single edit away, if only
    one is, is offered."""
    choices = sorted(choices)
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    if not close:
        close = [c for c in choices if _one_edit(str(name), c)]
    return f" Did you mean {close[0]!r}?" if len(close) == 1 else ""


def _one_edit(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter replaced, inserted, deleted, or two
    neighbours swapped (never ``a`` itself, never a one-letter name)."""
    if a == b or min(len(a), len(b)) < 2 or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        swapped = (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )
        return len(diff) == 1 or swapped
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def unknown_name(what: str, name: str, choices: Iterable[str], path: str | None = None) -> str:
    """The standard message for an unknown name: did-you-mean plus the list of what exists."""
    choices = sorted(choices)
    where = f"{path}: " if path else ""
    available = ", ".join(choices) if choices else "(none registered)"
    return f"{where}unknown {what} {show_value(name)}.{did_you_mean(name, choices)} Available: {available}."


#: The longest rendering of a user's value inside a message.
VALUE_WIDTH = 80


def show_value(value: object, width: int = VALUE_WIDTH) -> str:
    """``repr(value)`` cut to ``width`` characters, computed in bounded time and memory
    whatever the value's size (a config can hold long strings and big nested lists)."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlevel, shortener.maxlist, shortener.maxdict = 3, 6, 6
    shortener.maxstring = shortener.maxother = shortener.maxlong = width
    try:
        text = shortener.repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<unprintable>"
    return text if len(text) <= width else text[: width - 3] + "..."
