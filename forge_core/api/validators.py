"""Reusable validators for config fields and component options.

Each is an attrs validator, the third argument of :func:`~forge_core.api.option`
(``option(128, "...", at_least(1))``), whose message says what the value must be and
what it was (``must be at least 1, got 0``), and whose ``description`` the generated
configuration reference shows beside the field. The loader reports a failing validator
at its field's path (``$.train.optimizer_options.beta1``), every failing field of a
config at once.

Two checks need no validator because the loader applies them to every field: an ``int``
must fit in 64 bits, and a ``float`` must be finite (``.nan``, ``.inf`` and ``1e999`` are
refused). The number validators below refuse non-finite values too, for options built
in Python.

A plugin author uses them in an options class::

    import attrs
    from forge_core.api import at_least, between, option

    @attrs.frozen
    class WindowOptions:
        window: int = option(128, "Tokens each query sees.", at_least(1))
        dropout: float = option(0.0, "Share of attention weights dropped.", between(0, 1, high_open=True))

Checks of the file system (does a path exist, is it a shard directory) are not
validators: options are also built where the file system may differ (``forge-run
sample`` reads the options a run was trained with). They are compatibility rules, which
``forge-run check`` and training evaluate.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Callable
from typing import Any

import attrs

from forge_core.api.errors import show_value

#: The range of a config integer (a C ``int64``): larger values overflow torch and numpy.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


@attrs.frozen
class Validator:
    """A named predicate over one field's value. ``description`` completes the sentence
    "the value must be ..." (``"at least 1"``, ``"in [0, 1)"``)."""

    description: str
    test: Callable[[Any], bool]

    def __call__(self, instance: Any, attribute: Any, value: Any) -> None:
        if not self.test(value):
            raise ValueError(f"must be {self.description}, got {show_value(value)}")


def satisfies(description: str, test: Callable[[Any], bool]) -> Validator:
    """A validator from any predicate; ``description`` completes "must be ..."."""
    return Validator(description, test)


def _number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def at_least(low: float) -> Validator:
    """``value >= low``."""
    return Validator(f"at least {_bound(low)}", lambda v: _number(v) and v >= low)


def above(low: float) -> Validator:
    """``value > low``."""
    return Validator(f"above {_bound(low)}", lambda v: _number(v) and v > low)


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Validator:
    """``low <= value <= high``; ``low_open``/``high_open`` exclude an end."""
    text = f"in {'(' if low_open else '['}{_bound(low)}, {_bound(high)}{')' if high_open else ']'}"

    def test(v: Any) -> bool:
        if not _number(v):
            return False
        return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)

    return Validator(text, test)


#: A string with something besides whitespace.
non_blank = Validator("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))


def _inside(value: Any) -> bool:
    if not isinstance(value, str) or not value.strip() or value.endswith(("/", "\\")):
        return False
    if posixpath.isabs(value) or value.startswith("\\") or (len(value) > 1 and value[1] == ":"):
        return False
    return ".." not in value.replace("\\", "/").split("/")


@attrs.frozen
class _MaxChars(Validator):
    """Says how long a too-long string is and what the limit is."""

    limit: int = 0

    def __call__(self, instance: Any, attribute: Any, value: Any) -> None:
        if isinstance(value, str) and not self.test(value):
            raise ValueError(
                f"is {len(value):,} characters long, more than the {self.limit:,} it may have: "
                f"shorten it (got {show_value(value)})"
            )
        super().__call__(instance, attribute, value)


def max_chars(limit: int) -> Validator:
    """A string of at most ``limit`` characters: for names that become a file name or a
    tracker's field (a run name, a W&B project), which the file system or the tracker
    refuses, or which no one reads, far sooner than the config would."""
    return _MaxChars(
        f"a string of at most {limit:,} characters", lambda v: isinstance(v, str) and len(v) <= limit, limit
    )


#: Most bytes of one path component, and of a whole path (Linux's NAME_MAX and PATH_MAX).
NAME_MAX, PATH_MAX = 255, 4096


def _path_problem(value: str) -> str | None:
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > PATH_MAX:
        return f"is {size:,} bytes long, more than the {PATH_MAX:,} a path may have"
    for part in value.replace("\\", "/").split("/"):
        part_size = len(part.encode("utf-8", "surrogatepass"))
        if part_size > NAME_MAX:
            return (
                f"has a part of {part_size:,} bytes ({show_value(part, 40)}), more than the "
                f"{NAME_MAX} a file or directory name may have"
            )
    return None


@attrs.frozen
class _PathFits(Validator):
    """Says which part of a path is too long, and by how much, before its own test."""

    def __call__(self, instance: Any, attribute: Any, value: Any) -> None:
        problem = _path_problem(value) if isinstance(value, str) else None
        if problem:
            raise ValueError(f"{problem}: shorten it")
        super().__call__(instance, attribute, value)


#: A path the file system can hold: at most :data:`PATH_MAX` bytes, each part at most
#: :data:`NAME_MAX` (a longer one fails only when the run creates or opens it).
path_fits = _PathFits(
    f"a path of at most {PATH_MAX:,} bytes, each part at most {NAME_MAX}", lambda v: isinstance(v, str)
)

#: A relative path that stays inside the directory it is relative to (no ``..``), and
#: that the file system can hold (as :data:`path_fits`).
relative_path = _PathFits("a relative path inside the run directory (no '..', not absolute)", _inside)


def describe(field: attrs.Attribute) -> str:
    """What a field's validator allows, for the reference docs (empty when it has none
    of the validators above)."""
    validator = field.validator
    parts = getattr(validator, "_validators", None) or ((validator,) if validator else ())
    return "; ".join(v.description for v in parts if isinstance(v, Validator))
