"""Structure plain config data into attrs classes with cattrs: strict scalars (no
``2.7 -> 2``), unknown keys refused with a did-you-mean, every field validator's error
at its own path, every problem as ``(path, message)``."""

from __future__ import annotations

import heapq
import math
import re
import typing
from typing import Any

import attrs
import cattrs

from forge_core.api.errors import VALUE_WIDTH
from forge_core.api.options import option_key
from forge_core.api.unstable import INT_MAX, INT_MIN, describe, did_you_mean, show_value
from forge_core.config.errors import type_name
from forge_core.config.foreign_keys import unknown_key_hint


class ScalarError(TypeError):
    pass


def _strict_int(value: Any, _: type) -> int:
    if type(value) is int:
        if INT_MIN <= value <= INT_MAX:
            return value
        raise ScalarError(f"expected an integer from -2**63 to 2**63-1, got {show_value(value)}")
    raise ScalarError(f"expected an integer, got {show_value(value)} ({type_name(value)})")


def _strict_float(value: Any, _: type) -> float:
    if type(value) in (int, float):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isfinite(number):
            return number
        raise ScalarError(f"expected a finite number, got {show_value(value)}")
    raise ScalarError(f"expected a number, got {show_value(value)} ({type_name(value)})")


def _strict_str(value: Any, _: type) -> str:
    if type(value) is str:
        return value
    raise ScalarError(f"expected a string, got {show_value(value)} ({type_name(value)})")


def _strict_bool(value: Any, _: type) -> bool:
    if type(value) is bool:
        return value
    raise ScalarError(f"expected true or false, got {show_value(value)} ({type_name(value)})")


def _mapping(value: Any, _: type) -> dict:
    if isinstance(value, dict):
        return dict(value)
    raise ScalarError(f"expected a mapping, got {show_value(value)} ({type_name(value)})")


def _strict_list(value: Any, cl: type) -> list:
    if not isinstance(value, list):
        raise ScalarError(f"expected a list, got {show_value(value)} ({type_name(value)})")
    (item_type,) = typing.get_args(cl) or (Any,)
    out, errors = [], []
    for i, item in enumerate(value):
        try:
            out.append(converter.structure(item, item_type))
        except Exception as exc:  # noqa: BLE001 - collected, every item reported at its index
            exc.__notes__ = [
                *getattr(exc, "__notes__", []),
                cattrs.errors.IterableValidationNote(f"Structuring {cl} @ index {i}", i, item_type),
            ]
            errors.append(exc)
    if errors:
        raise cattrs.errors.IterableValidationError(f"While structuring {cl!r}", errors, cl)
    return out


class FieldValidatorError(ValueError):
    """An attrs validator of one field refused its value (the message is the validator's)."""


def _field_validator_errors(instance: Any, cl: type) -> list[Exception]:
    """Run every field validator of ``cl`` on ``instance`` (built with validators off) and
    return their errors, each noted with its field so that its path ends in the field."""
    errors: list[Exception] = []
    for field in attrs.fields(cl):
        if field.validator is None:
            continue
        try:
            field.validator(instance, field, getattr(instance, field.name))
        except Exception as exc:  # a validator may raise anything; report it, don't crash
            # attrs' own validators raise with (message, attribute, ...) as args.
            message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
            error = FieldValidatorError(message)
            error.__notes__ = [
                cattrs.errors.AttributeValidationNote(
                    f"Validating class {cl.__qualname__} @ attribute {field.name}",
                    option_key(field),
                    field.type,
                )
            ]
            errors.append(error)
    return errors


def _say_what_is_allowed(located: list[tuple[Exception, Any]], cl: type) -> None:
    """Complete a scalar's refusal (``expected a number, got 'abc'``) with what its field's
    validator allows (``; weight must be above 0``), so the message says what to write."""
    fields = {option_key(f): f for f in attrs.fields(cl)}
    for error, note in located:
        field = fields.get(getattr(note, "name", None))
        allowed = describe(field) if isinstance(error, ScalarError) and field is not None else ""
        if allowed:
            error.args = (f"{error.args[0]}; {option_key(field)} must be {allowed}",)


def _renamed(cl: type) -> dict[str, str]:
    """The attributes of ``cl`` whose config key is not their name (:func:`option_key`)."""
    return {f.name: option_key(f) for f in attrs.fields(cl) if option_key(f) != f.name}


def _at_config_keys(exc: cattrs.errors.ClassValidationError, renamed: dict[str, str]) -> None:
    """Make the errors of renamed attributes name their config key: cattrs notes the
    attribute's name, and the error's path (``$.checkpoint.async``) is made from it."""
    for error in exc.exceptions:
        error.__notes__ = [
            cattrs.errors.AttributeValidationNote(str(note), renamed[note.name], note.type)
            if isinstance(note, cattrs.errors.AttributeValidationNote) and note.name in renamed
            else note
            for note in getattr(error, "__notes__", [])
        ]


def _attrs_structure_factory(conv: cattrs.Converter):
    """The default attrs hook, except that when the constructor fails because of field
    validators, every failing field is reported at its own path (``$.attention.options.window``)
    rather than the first one at the class's path. attrs runs validators inside
    ``__init__`` and stops at the first, so they are rerun one by one on an instance
    built with validators disabled."""

    def factory(cl: type) -> Any:
        renamed = _renamed(cl)
        overrides = {name: cattrs.gen.override(rename=key) for name, key in renamed.items()}
        base = cattrs.gen.make_dict_structure_fn(cl, conv, **overrides)

        def structure_attrs(value: Any, _: type) -> Any:
            split = getattr(cl, "split_raw", None)
            if split is not None and isinstance(value, dict):
                # A section with keys of its own and keys declared elsewhere (the
                # parallel degrees, declared by strategies): those are checked later,
                # against what the registry declares.
                own, extra = split(value)
                value = {**own, "degrees": extra}
            try:
                return base(value, cl)
            except cattrs.errors.ClassValidationError as exc:
                _at_config_keys(exc, renamed)
                located, unlocated = exc.group_exceptions()
                _say_what_is_allowed(located, cl)
                if located or any(isinstance(e, cattrs.ForbiddenExtraKeysError) for e in unlocated):
                    raise  # structuring errors of fields or keys, already located
                # Every field structured, so the class's __init__ raised: a field
                # validator or __attrs_post_init__.
                try:
                    # A global switch, but configs are loaded before any other thread
                    # builds attrs instances; the context restores it whatever happens.
                    with attrs.validators.disabled():
                        instance = base(value, cl)
                except Exception:
                    raise exc from None  # __attrs_post_init__: stays at the class's path
                errors = _field_validator_errors(instance, cl)
                if not errors:
                    raise
                raise cattrs.errors.ClassValidationError(
                    f"While validating {cl.__qualname__}", errors, cl
                ) from None

        return structure_attrs

    return factory


def make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook_factory(attrs.has, _attrs_structure_factory(conv))
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is dict or t is dict, _mapping)
    conv.register_structure_hook_func(lambda t: typing.get_origin(t) is list, _strict_list)
    return conv


converter = make_converter()


#: Most unknown keys of one mapping (or unknown names of one list) named one by one, each
#: with its did-you-mean; the others are counted. A pasted file of another tool's
#: settings can hold thousands.
MAX_UNKNOWN_SHOWN = 10


def unknown_key(key: str, cl: type) -> str:
    """What is said about one key that the attrs class ``cl`` (a config section or an
    options class) does not have: its did-you-mean among ``cl``'s keys. Every hint about
    a key Forge does not know belongs here."""
    hint = did_you_mean(str(key), [option_key(a) for a in attrs.fields(cl)]) + unknown_key_hint(cl, str(key))
    return f"unknown key {show_value(key)}" + (f".{hint}" if hint else "")


def _unknown_keys(keys: set[str], cl: type) -> str:
    """The unknown keys of one mapping: the first few by name, then how many more, then
    the keys it has. Linear in the number of keys: only those shown get a did-you-mean."""
    shown = heapq.nsmallest(MAX_UNKNOWN_SHOWN, keys, key=str)
    more = f"; and {len(keys) - len(shown):,} more unknown keys" if len(keys) > len(shown) else ""
    known = ", ".join(option_key(a) for a in attrs.fields(cl))
    return "; ".join(unknown_key(key, cl) for key in shown) + f"{more} (keys here: {known})"


def _format_exception(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return _unknown_keys(exc.extra_fields, exc.cl)
    if isinstance(exc, KeyError):
        return f"required key {show_value(exc.args[0])} is missing"
    if isinstance(exc, (ScalarError, FieldValidatorError)):
        return str(exc)
    if typing.get_origin(type_) is typing.Literal:
        choices = typing.get_args(type_)
        value = exc.args[0] if exc.args else "?"
        match = re.match(r"(.*) not in literal", str(value), re.S)
        got = _clip(str(match.group(1) if match else value))
        return (
            f"expected one of {', '.join(map(repr, choices))}, got {got}."
            f"{did_you_mean(got, map(str, choices))}"
        )
    if attrs.has(type_):
        return f"expected a mapping, got something else ({_clip(str(exc))})"
    return _clip(f"{type(exc).__name__}: {exc}", 300)


def _clip(text: str, width: int = VALUE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def structure(raw: Any, cls: type, root: str = "$") -> tuple[Any, list[tuple[str, str]]]:
    """Structure ``raw`` into ``cls``; returns ``(instance or None, issues)``."""
    if not isinstance(raw, dict):
        return None, [(root, f"expected a mapping, got {show_value(raw)} ({type_name(raw)})")]
    try:
        return converter.structure(raw, cls), []
    except Exception as exc:  # cattrs raises ClassValidationError groups
        lines = cattrs.transform_error(exc, path=root, format_exception=_format_exception)
        issues = []
        for line in lines:
            message, _, path = line.rpartition(" @ ")
            issues.append((path or root, message or line))
        return None, issues
