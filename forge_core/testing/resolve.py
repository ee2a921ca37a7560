"""Turn what a plugin author hands the conformance kit into something to test.

A check accepts a component the way an author has it at hand: a registered name
(looked up in the registries, with ``extra_plugins`` registered in process), a spec
object, the implementation class, or (for attention) a constructed instance. Options may
be ``None`` (the spec's defaults), a raw mapping (structured against the spec's options
class exactly as a config block would be, so invalid options are reported the same
way), or an options instance. Misuse of the kit is a ``ValueError``; only a component
that breaks its contract raises ``AssertionError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from forge_core.api import ComponentSpec, NoOptions


@attrs.frozen
class Resolved:
    """A component ready to be constructed: its spec (``None`` when the author passed a
    bare class or instance), the implementation object, the structured options, and a
    label for messages."""

    spec: Any
    impl: Any
    options: Any
    label: str


def resolve(
    kind: str,
    component: Any,
    options: Any = None,
    extra_plugins: Iterable[tuple[str, Any]] = (),
) -> Resolved:
    """Resolve ``component`` (name, spec, class or instance) of registry ``kind``."""
    spec = None
    if isinstance(component, str):
        from forge_core.registry import load_registries

        spec = load_registries(extra=tuple(extra_plugins))[kind].get(component)
    elif isinstance(component, ComponentSpec):
        spec = component
    if spec is not None:
        if spec.kind != kind:
            raise ValueError(f"expected a {kind} spec, got a {spec.kind} spec ({spec.name!r})")
        impl = spec.load()
        label = f"{kind} {spec.name!r}"
    else:
        impl = component
        label = f"{kind} {getattr(component, '__name__', type(component).__name__)}"
    return Resolved(spec, impl, structure_options(spec, options), label)


def structure_options(spec: Any, options: Any) -> Any:
    """The options instance a component is constructed with."""
    options_cls = spec.options if spec is not None else NoOptions
    if options is None:
        return options_cls()
    if isinstance(options, dict):
        if spec is None:
            raise ValueError(
                "options given as a mapping need the component's spec (its options class) to be "
                "structured against: pass the spec or its registered name, or an options instance"
            )
        from forge_core.config.structuring import structure

        value, issues = structure(options, options_cls, "$.options")
        if issues:
            raise ValueError(
                f"invalid options for {spec.kind} {spec.name!r}: "
                + "; ".join(f"{path}: {message}" for path, message in issues)
            )
        return value
    return options
