"""The documented option: the one way a config field or a component option is declared.

    import attrs
    from forge_core.api import at_least, option

    @attrs.frozen
    class WindowOptions:
        window: int = option(128, "Tokens each query sees.", at_least(1))
        paths: list[str] = option([], "Files to read.")

The meaning travels in the field's ``metadata["doc"]``, which ``forge-run plugins``, the
generated references and ``docs/configuration.md`` show; :func:`option_doc` reads it back.

A key that is a Python keyword (``async``) cannot name an attribute: ``key="async"``
gives the key a config writes, and :func:`option_key` reads it back (the attribute's
name otherwise). Configs are read, written, refused and documented by that key.
"""

from __future__ import annotations

from typing import Any

import attrs

#: The metadata key the documentation of a field is kept under.
DOC_KEY = "doc"
#: The metadata key of a config key that differs from the attribute's name.
KEY_KEY = "key"

_MUTABLE = (list, dict, set)


def option(default: Any, doc: str, validator: Any = None, key: str | None = None, **kwargs: Any) -> Any:
    """An attrs field with ``default``, its meaning ``doc`` and an optional validator
    (:mod:`forge_core.api.validators`); ``key`` is the config key when it cannot be the
    attribute's name (a Python keyword); other keywords (``converter``, ``kw_only``, ...)
    go to ``attrs.field``. A list, dict or set default is copied for every instance, so
    two configs never share one."""
    if not isinstance(doc, str) or not doc.strip():
        raise TypeError(
            f"option(default={default!r}, doc={doc!r}): every option needs a doc, a non-empty "
            "string saying what it means (the references show it)"
        )
    metadata = {DOC_KEY: doc} if key is None else {DOC_KEY: doc, KEY_KEY: key}
    if isinstance(default, _MUTABLE):
        value = default
        return attrs.field(
            factory=lambda: type(value)(value), validator=validator, metadata=metadata, **kwargs
        )
    return attrs.field(default=default, validator=validator, metadata=metadata, **kwargs)


def option_doc(field: attrs.Attribute) -> str:
    """The documentation :func:`option` gave ``field`` (empty for a plain attrs field)."""
    return field.metadata.get(DOC_KEY, "")


def option_key(field: attrs.Attribute) -> str:
    """The key a config writes for ``field``: the ``key`` :func:`option` gave it, else its
    name."""
    return field.metadata.get(KEY_KEY, field.name)
