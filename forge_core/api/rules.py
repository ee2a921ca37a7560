"""What a compatibility rule is and what it sees.

A :class:`Rule` is declared by the plugin whose limit it describes; its ``check`` is
called with the :class:`Plan` of a config (the resolved config, the chosen specs, the
active strategies and degrees) and returns what is wrong. The engine that evaluates
every rule and renders the report is :mod:`forge_core.rules`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import attrs

from forge_core.api.options import option_key

#: How a rule's finding counts: an ``error`` stops the run, a ``warning`` is reported.
Severity = Literal["error", "warning"]


class _NoDefault:
    """The default of ``get``'s ``default``: a missing path raises ``KeyError``."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


_MISSING = _NoDefault()


#: In a rule's ``paths``: every ``parallel.<dim>`` degree of the declared mesh dimensions.
DEGREES = "parallel.*"


@attrs.frozen
class Rule:
    """A compatibility rule.

    ``check(plan)`` returns ``None`` (or an empty list) when the config is fine, otherwise
    a message, or a list of messages, saying what is wrong and why. ``paths`` are the
    config fields the rule is about (``"parallel.pp"``; :data:`DEGREES`, ``"parallel.*"``,
    stands for every degree); the report shows their values.
    ``fix`` is the remedy the rule reference prints; ``fix_for(plan)``, when given, is the
    remedy a finding reports instead, for a rule whose fix depends on the config (the
    world-size rule does not tell a config with ``dp_shard: -1`` to set it).
    """

    id: str
    severity: Severity = attrs.field(validator=attrs.validators.in_(("error", "warning")))
    paths: tuple[str, ...] = attrs.field(converter=tuple)
    summary: str
    check: Callable[[Plan], None | str | Iterable[str]]
    fix: str
    fix_for: Callable[[Plan], str] | None = None


@attrs.frozen
class ActiveStrategy:
    """A parallelism strategy (or wrapper) the config switches on: its spec, its
    structured options (``parallel.options.<name>``, defaults where the config gives
    none) and the plugin that registered it."""

    spec: Any
    options: Any
    plugin: str

    @property
    def name(self) -> str:
        return self.spec.name


@attrs.frozen
class ChosenTransform:
    """A model transform the config lists in ``model.transforms``: its spec, its
    structured options (``model.transform_options.<name>``, defaults where the config
    gives none) and the plugin that registered it."""

    spec: Any
    options: Any
    plugin: str

    @property
    def name(self) -> str:
        return self.spec.name


@attrs.frozen
class ChosenSource:
    """A data source the run reads: where the config names it (``data.source``, or
    ``data.sources[i]`` in a mixture), its spec, its structured options, its weight in
    the mixture (1 for the one source) and its configured label (``""``: none)."""

    where: str
    spec: Any
    options: Any
    weight: float = 1.0
    label: str = ""

    @property
    def name(self) -> str:
        return self.spec.name


@attrs.frozen
class Plan:
    """A judged config: what every rule sees, and exactly what the run builds (the
    trainer and ``parallelize`` consume this object; nothing is recomputed from the raw
    config).

    - ``config``: the resolved :class:`~forge_core.config.schema.ForgeConfig`; option
      blocks are instances of the chosen components' options classes.
    - ``specs``: the chosen spec per kind (``"model"``, ``"attention"``, ``"source"``,
      ``"tokenizer"``, ``"packer"``, ``"optimizer"``, ``"schedule"``); for a mixture of
      sources, ``"source"`` is the first of ``sources``.
    - ``strategies``: the active strategies (:class:`ActiveStrategy`), in the order they
      are applied.
    - ``degrees``: ``parallel.*`` degrees by mesh dimension, in mesh order, with the
      dimension that fills the world (``dp_shard: -1``) resolved (left at -1 when the
      world size is unknown).
    - ``world_size``: from ``--world-size`` or the torchrun environment, else the
      config's ``run.world_size`` (the size it states it is made for), else ``None``.
    - ``emitted``: the per-token metadata the chosen packer emits under its options.
    - ``facts``: the model's :class:`~forge_core.api.ModelFacts` under its options
      (``ModelSpec.facts``), or ``None`` when the model declares none.
    - ``strategy_options``: every registered strategy's structured options, active or
      not (read them with :meth:`options_of`).
    - ``sources``: every source the run reads (:class:`ChosenSource`), in config order:
      the one of ``data.source``, or each entry of ``data.sources``.
    - ``eval_source``: the source named by ``eval.source`` (:class:`ChosenSource`,
      ``where`` is ``eval.source``), or ``None`` when evaluation reads the held-out split.
    - ``dims``: the declared mesh dimensions (:class:`~forge_core.api.MeshDim`), in mesh
      order; :attr:`data_parallel_size` and :attr:`token_split` read them.
    - ``transforms``: the model transforms of ``model.transforms``
      (:class:`ChosenTransform`), in the order they are applied.
    """

    config: Any
    specs: dict[str, Any]
    strategies: tuple[ActiveStrategy, ...] = ()
    degrees: dict[str, int] = attrs.field(factory=dict)
    world_size: int | None = None
    emitted: frozenset[str] = frozenset()
    facts: Any = None
    strategy_options: dict[str, Any] = attrs.field(factory=dict)
    sources: tuple[ChosenSource, ...] = ()
    eval_source: ChosenSource | None = None
    dims: tuple[Any, ...] = ()
    transforms: tuple[ChosenTransform, ...] = ()

    def _product(self, flag: str) -> int:
        return math.prod(self.degrees.get(d.name, 1) for d in self.dims if getattr(d, flag))

    @property
    def data_parallel_size(self) -> int:
        """How many different batches a step reads: the product of the degrees of the
        dimensions that read their own (``dp_replicate x dp_shard``); below 1 while the
        world-filling degree is unresolved."""
        return self._product("reads_own_batch")

    @property
    def token_split(self) -> int:
        """Over how many ranks each batch's tokens are split (``cp``): 1 without."""
        return self._product("splits_tokens")

    def expand_paths(self, paths: Iterable[str]) -> tuple[str, ...]:
        """``paths`` with :data:`DEGREES` replaced by ``parallel.<dim>`` for every
        declared dimension."""
        out: list[str] = []
        for path in paths:
            out += [f"parallel.{d.name}" for d in self.dims] if path == DEGREES else [path]
        return tuple(out)

    def options_of(self, strategy: str) -> Any:
        """The structured options of a strategy, active or not (its defaults when the
        config gives none)."""
        try:
            return self.strategy_options[strategy]
        except KeyError:
            known = ", ".join(sorted(self.strategy_options)) or "none"
            raise KeyError(
                f"no parallelism strategy {strategy!r} is registered (registered: {known})"
            ) from None

    def is_active(self, strategy: str) -> bool:
        """Whether the config switches the strategy on."""
        return any(s.name == strategy for s in self.strategies)

    def get(self, path: str, default: Any = _MISSING) -> Any:
        """The value at a dotted config path, strategy options included (with defaults).

        ``parallel.options.<strategy>.<field>`` reads :meth:`options_of`. A missing path
        returns ``default``, or raises ``KeyError`` without one."""
        parts = path.split(".")
        if parts[:2] == ["parallel", "options"] and len(parts) > 2 and parts[2] in self.strategy_options:
            options = self.strategy_options[parts[2]]
            return get_path(options, ".".join(parts[3:]), default) if len(parts) > 3 else options
        return get_path(self.config, path, default)


@attrs.frozen
class Violation:
    """One finding of one rule: which rule, its severity, the plugin that declared it,
    what is wrong, the fix, and the config fields the rule names with their values."""

    rule_id: str
    severity: Severity
    plugin: str
    message: str
    fix: str
    fields: tuple[tuple[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule_id,
            "severity": self.severity,
            "plugin": self.plugin,
            "message": self.message,
            "fix": self.fix,
            "fields": {path: _jsonable(value) for path, value in self.fields},
        }


def get_path(obj: Any, path: str, default: Any = _MISSING) -> Any:
    """Read ``"a.b.c"`` from nested attrs objects and mappings; ``"a.items[1].b"``
    indexes a list."""
    for part in path.split("."):
        name, *indices = part.replace("]", "").split("[")
        for step in ([name] if name else []) + [int(i) for i in indices]:
            if isinstance(step, int):
                found = isinstance(obj, (list, tuple)) and -len(obj) <= step < len(obj)
                value = obj[step] if found else None
            elif isinstance(obj, dict):
                found, value = step in obj, obj.get(step)
            else:
                step = _attribute(obj, step)
                found, value = hasattr(obj, step), getattr(obj, step, None)
            if not found:
                if default is _MISSING:
                    raise KeyError(path)
                return default
            obj = value
    return obj


def _attribute(obj: Any, key: str) -> str:
    """The attribute of ``obj`` a config key names: itself, or the attribute whose
    :func:`~forge_core.api.options.option_key` it is (``async`` is ``async_save``)."""
    if not attrs.has(type(obj)) or hasattr(obj, key):
        return key
    return next((f.name for f in attrs.fields(type(obj)) if option_key(f) == key), key)


def _jsonable(value: Any) -> Any:
    if attrs.has(type(value)):
        return attrs.asdict(value)
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)
