"""The mesh dimensions the registered strategies declare, the ``parallel.*`` degrees
resolved against a world size, and the world size and ranks a launcher's variables give,
checked as ASCII integers (no torch needed).

Every dimension, the built-ins' included, comes from a
:class:`~forge_core.api.MeshDim` on a :class:`~forge_core.api.ParallelismSpec`: its
degree key, its place in the mesh and how it combines with data parallelism. Nothing
here names a dimension.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from forge_core.api import ForgeError, MeshDim
from forge_core.api.unstable import show_value

#: Keys of the ``parallel`` section that are not degrees.
SECTION_KEYS = ("wrappers", "options")


#: The largest process count or rank read from a launcher's variables (an int32, as
#: torch.distributed takes them); more digits are not a number a launcher writes.
MAX_PROCESSES = (1 << 31) - 1
_ASCII_DIGITS = re.compile(r"[0-9]+")


def launched_by_torchrun() -> bool:
    """Whether torchrun (or another launcher setting its variables) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def count_problem(value: str, minimum: int) -> str | None:
    """Why ``value`` is not a count or rank of at least ``minimum`` written as ASCII
    decimal digits (``int()`` would also take ``'٣'`` or `` 3_0 ``), or ``None``."""
    text = value.strip()
    digits = text.removeprefix("-")
    if not _ASCII_DIGITS.fullmatch(digits):
        return "not a whole number written in ASCII digits 0-9"
    if digits != text or int(digits) < minimum:
        return f"must be at least {minimum}"
    if len(digits) > len(str(MAX_PROCESSES)) or int(digits) > MAX_PROCESSES:
        return f"more than {MAX_PROCESSES}"
    return None


def env_count(env: Mapping[str, str], name: str, minimum: int, fix: str, default: int | None = None) -> int:
    """The launcher variable ``name`` of ``env`` as an integer of at least ``minimum``
    (ASCII digits); ``default`` when it is unset (a ForgeError when there is none), and
    a ForgeError naming the variable, its value, why and ``fix`` when it is no such number."""
    if name not in env:
        if default is None:
            raise ForgeError(f"{name} is not set. {fix}")
        return default
    problem = count_problem(env[name], minimum)
    if problem:
        raise ForgeError(f"{name}={show_value(env[name])}: {problem}. {fix}")
    return int(env[name].strip())


#: What to do about a torchrun variable that is not a number.
TORCHRUN_FIX = (
    "torchrun (and `forge-run --nproc N`) sets RANK, WORLD_SIZE and LOCAL_RANK for every process: "
    "start forge-run with one of them, or unset the variable to train in one process"
)


def torchrun_place(env: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """``(rank, world size, local rank)`` of a process torchrun started, each checked
    (a rank below the world size); ``(0, 1, 0)`` when no launcher started it."""
    env = os.environ if env is None else env
    if not ("RANK" in env and "WORLD_SIZE" in env):
        return 0, 1, 0
    world = env_count(env, "WORLD_SIZE", 1, TORCHRUN_FIX)
    rank = env_count(env, "RANK", 0, TORCHRUN_FIX)
    local = env_count(env, "LOCAL_RANK", 0, TORCHRUN_FIX, default=0)
    if rank >= world:
        raise ForgeError(f"RANK={rank} is not below WORLD_SIZE={world}. {TORCHRUN_FIX}")
    return rank, world, local


def world_size_from_env() -> int | None:
    """The world size torchrun exported, if this process was started by it (a
    ForgeError when ``WORLD_SIZE`` is set and is no count of processes)."""
    if not os.environ.get("WORLD_SIZE", "").strip():
        return None
    return env_count(os.environ, "WORLD_SIZE", 1, TORCHRUN_FIX)


def mesh_dims(registry: Any) -> tuple[MeshDim, ...]:
    """The dimensions the usable strategies of ``registry`` declare, in mesh order
    (ascending ``place``). A declaration that cannot hold (two strategies claiming one
    name or place, a second dimension that fills the world, ``shards_with`` naming
    nothing) is a ForgeError naming the plugins."""
    owners: dict[str, str] = {}
    dims: list[MeshDim] = []
    for name in registry.names():
        spec, plugin = registry.get(name), registry.plugin_of(name)
        dim = spec.dim
        if dim is None:
            if spec.mesh_dim is not None and all(spec.mesh_dim != d for d in _declared_names(registry)):
                raise ForgeError(
                    f"strategy {name!r} (plugin {plugin!r}) is switched on by parallel.{spec.mesh_dim}, "
                    "but no strategy declares that mesh dimension: declare it with "
                    "ParallelismSpec(dim=MeshDim(...))"
                )
            continue
        if not isinstance(dim, MeshDim):
            raise ForgeError(f"strategy {name!r} (plugin {plugin!r}): dim must be a MeshDim, got {dim!r}")
        if dim.name in SECTION_KEYS or not dim.name.isidentifier():
            raise ForgeError(
                f"strategy {name!r} (plugin {plugin!r}) declares the mesh dimension {dim.name!r}, which "
                f"cannot be a degree key under parallel (not an identifier, or one of {SECTION_KEYS})"
            )
        if spec.mesh_dim not in (None, dim.name):
            raise ForgeError(
                f"strategy {name!r} (plugin {plugin!r}) declares the mesh dimension {dim.name!r} but is "
                f"switched on by {spec.mesh_dim!r}: they must be the same"
            )
        for other in dims:
            if other.name == dim.name or other.place == dim.place:
                clash = "name" if other.name == dim.name else f"place {dim.place}"
                raise ForgeError(
                    f"mesh dimension {dim.name!r} of strategy {name!r} (plugin {plugin!r}) has the {clash} "
                    f"of {other.name!r}, declared by {owners[other.name]}: choose another"
                )
        owners[dim.name] = f"strategy {name!r} (plugin {plugin!r})"
        dims.append(dim)
    fillers = [d.name for d in dims if d.fills_world]
    if len(fillers) > 1:
        raise ForgeError(f"more than one mesh dimension fills the world size (-1): {', '.join(fillers)}")
    names = {d.name for d in dims}
    for dim in dims:
        if dim.shards_with is not None and dim.shards_with not in names:
            raise ForgeError(
                f"mesh dimension {dim.name!r} ({owners[dim.name]}) shards with {dim.shards_with!r}, "
                f"which no strategy declares (declared: {', '.join(sorted(names))})"
            )
    return tuple(sorted(dims, key=lambda d: d.place))


def _declared_names(registry: Any) -> list[str]:
    return [registry.get(n).dim.name for n in registry.names() if registry.get(n).dim is not None]


def resolve_degrees(
    given: dict[str, int], dims: tuple[MeshDim, ...], world_size: int | None
) -> dict[str, int]:
    """Degrees by mesh dimension (mesh order), the config's or the declared default,
    with the dimension that ``fills_world`` taking what is left of the world size when
    it is -1. Stays -1 when the world size is unknown or does not divide; the
    world-size rule reports that case."""
    degrees = {d.name: given.get(d.name, d.default) for d in dims}
    for dim in dims:
        if dim.fills_world and degrees[dim.name] == -1 and world_size is not None:
            others = math.prod(v for k, v in degrees.items() if k != dim.name)
            if others > 0 and world_size % others == 0:
                degrees[dim.name] = world_size // others
    return degrees


def switching_degrees(degrees: dict[str, int], dims: tuple[MeshDim, ...]) -> dict[str, int]:
    """The degree that switches each dimension's strategy on: its own times those of the
    dimensions that shard with it (``dp_shard x cp`` switches FSDP on)."""
    out = dict(degrees)
    for dim in dims:
        own = degrees.get(dim.name, dim.default)
        if dim.shards_with is not None and own > 0:
            out[dim.shards_with] = out.get(dim.shards_with, 1) * own
    return out


def active_strategies(
    registry: Any,
    degrees: dict[str, int],
    wrappers: list[str],
    setting: Callable[[str], Any] = lambda path: False,
) -> list[Any]:
    """The parallelism specs a config switches on, in application order.

    A strategy with a mesh dimension is active when its switching degree
    (:func:`switching_degrees`) is above 1, unless a strategy it ``yields_to`` is active
    too; a wrapper is active when named in ``parallel.wrappers``, or when the config path
    its spec names in ``enabled_by`` is true (``setting(path)`` reads the config).
    """
    switching = switching_degrees(degrees, mesh_dims(registry))

    def switched_on(s: Any) -> bool:
        if s.mesh_dim is not None:
            return switching.get(s.mesh_dim, 1) > 1
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
