"""Resolve the ``parallel.*`` degrees against a world size (no torch needed)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher setting its variables) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def world_size_from_env() -> int | None:
    """The world size torchrun exported, if this process was started by it."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value and value.isdigit() else None


def resolve_degrees(parallel: Any, world_size: int | None) -> dict[str, int]:
    """Degrees by mesh dimension, with ``dp_shard: -1`` taking what is left of the world
    size. Stays -1 when the world size is unknown or does not divide; the world-size rule
    reports that case."""
    degrees = {dim: getattr(parallel, dim) for dim in MESH_DIMS}
    if degrees["dp_shard"] == -1 and world_size is not None:
        others = math.prod(v for k, v in degrees.items() if k != "dp_shard")
        if others > 0 and world_size % others == 0:
            degrees["dp_shard"] = world_size // others
    return degrees


def active_strategies(
    registry: Any,
    degrees: dict[str, int],
    wrappers: list[str],
    setting: Callable[[str], Any] = lambda path: False,
) -> list[Any]:
    """The parallelism specs a config switches on, in application order.

    A strategy with a mesh dimension is active when that degree is above 1, unless a
    strategy it ``yields_to`` is active too; a wrapper is active when named in
    ``parallel.wrappers``, or when the config path its spec names in ``enabled_by`` is
    true (``setting(path)`` reads the config).
    """

    def switched_on(s: Any) -> bool:
        if s.mesh_dim is not None:
            return degrees.get(s.mesh_dim, 1) > 1
        return s.name in wrappers or (s.enabled_by is not None and bool(setting(s.enabled_by)))

    # A strategy switched on by a degree is never named in the config, so a clashing one
    # is refused here, with the way to choose, rather than left out of the plan.
    for name, clash in registry.clashes.items():
        if any(switched_on(entry.spec) for entry in clash.entries):
            registry.get(name, "parallel")
    specs = [registry.get(name) for name in registry.names()]
    on = {s.name for s in specs if switched_on(s)}
    chosen = [s for s in specs if s.name in on and not (set(s.yields_to) & on)]
    return sorted(chosen, key=lambda s: (s.order, s.name))
