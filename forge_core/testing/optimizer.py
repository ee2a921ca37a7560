"""The optimizer check of the conformance kit: :func:`check_optimizer` runs an optimizer
factory over DTensor parameters, as FSDP and tensor parallelism hand them to it, on
one process.

Under ``parallel.dp_shard`` or ``parallel.tp`` every parameter an optimizer sees is a
``DTensor`` (its gradient too), sharded over a device mesh. An update written for plain
tensors can fail there: an in-place operation whose result the sharding cannot keep
(torch's Adafactor squares a norm in place, ``pow_``, on a value that is a partial sum
across the shards: ``in-place operations that require placement changes are not
supported``), or state created with the whole parameter's shape beside a shard's
gradient. Such a failure surfaces only in a multi-process run, well into start-up.

A mesh of one process is enough to see the first kind: DTensor checks placements the
same way whatever the mesh size. So the check starts a one-rank ``gloo`` group in the
test's own process (no port, no launcher; the group is torn down afterwards) and, for
each layout a strategy gives a parameter (FSDP's ``Shard(0)``, tensor parallelism's
row-wise ``Shard(1)``, and both on a two-dimensional mesh), steps the optimizer on a
small module's parameters from the same gradients as a plain-tensor copy, then
compares. What it reports, as ``AssertionError`` naming the layout and the parameter:

- ``step()`` raising (the in-place hazard named by the operation torch refused, with the
  fix: compute that value out of place);
- state of the parameter's whole shape that is a plain tensor while the parameter is a
  DTensor (it would not match a shard, and a checkpoint could not reshard it);
- parameters after the steps that differ from the plain-tensor run by more than the
  rounding of float64 (one process: the same arithmetic).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from forge_core.api import NamedParameter
from forge_core.testing.resolve import resolve
from forge_core.testing.tolerance import assert_within_rounding

#: Each layout: its name, the mesh shape, and the placements of a matrix (2-D) and of a
#: vector (1-D) parameter, as FSDP (``Shard(0)`` over ``dp_shard``) and tensor
#: parallelism (a row-wise projection is ``Shard(1)``; norms are replicated) give them.
LAYOUTS: tuple[tuple[str, tuple[int, ...], tuple[Any, ...], tuple[Any, ...]], ...] = (
    ("fsdp: Shard(0)", (1,), (Shard(0),), (Shard(0),)),
    ("tp row-wise: Shard(1), vectors replicated", (1,), (Shard(1),), (Replicate(),)),
    ("fsdp x tp: (Shard(0), Shard(1))", (1, 1), (Shard(0), Shard(1)), (Shard(0), Replicate())),
)

_REFUSED_OP = re.compile(r"(aten\.\w+)(?:\.\w+)?:")


@attrs.frozen
class OptimizerReport:
    """What a passing optimizer did: the layouts it stepped on, how many steps each, and
    the largest difference from the plain-tensor run, as a share of the float64
    rounding tolerance (below 1)."""

    layouts: tuple[str, ...]
    steps: int
    worst: float


class _Module(torch.nn.Module):
    """One parameter of each role: an embedding, a projection with a bias, a norm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(12, 8)
        self.proj = torch.nn.Linear(8, 6)
        self.norm = torch.nn.LayerNorm(6)


_ROLES = {"embed.weight": "embedding", "proj.weight": "matrix", "proj.bias": "bias"}


def _named(module: torch.nn.Module) -> list[NamedParameter]:
    return [
        NamedParameter(name, param, _ROLES.get(name, "norm")) for name, param in module.named_parameters()
    ]


@contextlib.contextmanager
def one_process_group() -> Iterator[None]:
    """A one-rank gloo group for the check, unless this process already has one."""
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise ValueError(
                "the kit's DTensor checks (check_optimizer, check_strategy) run on one process; call them "
                "outside a multi-process group"
            )
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _gradients(module: torch.nn.Module, steps: int, seed: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            name: torch.randn(p.shape, generator=generator, dtype=torch.float64)
            for name, p in module.named_parameters()
        }
        for _ in range(steps)
    ]


def _step_all(optimizer: Any, named: list[NamedParameter], grads: list[dict], place: Callable) -> None:
    for step in grads:
        for p in named:
            p.param.grad = place(p.name, step[p.name])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _hazard(label: str, layout: str, exc: Exception) -> AssertionError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    why = f"{type(exc).__name__}: {text}"
    if "placement" in str(exc) and "in-place" in str(exc):
        op = _REFUSED_OP.search(str(exc))
        what = f"the in-place operation {op[1]}" if op else "an in-place operation"
        return AssertionError(
            f"{label}: step() fails on DTensor parameters laid out as {layout}, as FSDP and tensor "
            f"parallelism give them: {what} writes into a sharded tensor a value whose sharding "
            f"differs (a partial sum, a norm across shards), which DTensor cannot keep in place ({why}). "
            f"Compute that value out of place (x = x.pow(2), not x.pow_(2)), or keep the optimizer to "
            f"runs without parallel.dp_shard and parallel.tp."
        )
    return AssertionError(
        f"{label}: step() fails on DTensor parameters laid out as {layout}, as FSDP and tensor "
        f"parallelism give them: {why}"
    )


def _check_state(label: str, optimizer: Any, named: list[NamedParameter], layout: str) -> None:
    for p in named:
        for key, value in optimizer.state.get(p.param, {}).items():
            if (
                isinstance(value, torch.Tensor)
                and not isinstance(value, DTensor)
                and value.shape == p.param.shape
            ):
                raise AssertionError(
                    f"{label}: state {key!r} of parameter {p.name!r} (laid out as {layout}) is a plain "
                    f"tensor of the whole parameter's shape {tuple(value.shape)} while the parameter is a "
                    "DTensor: on more than one process it would not match the shard it updates, and a "
                    "checkpoint could not reshard it. Create state from the parameter "
                    "(torch.zeros_like(p), p.new_zeros(...)), which keeps its sharding."
                )


def check_optimizer(
    optimizer: Any,
    options: Any = None,
    *,
    lr: float = 1e-2,
    steps: int = 3,
    seed: int = 0,
    extra_plugins: Iterable[tuple[str, Any]] = (),
) -> OptimizerReport:
    """Check an optimizer over DTensor parameters on one process (module docstring);
    raise AssertionError naming the layout, and the parameter, that fails.

    ``optimizer`` is a registered name, an ``OptimizerSpec`` or the factory itself; its
    factory is called as Forge calls it, ``build(named_params=[NamedParameter, ...],
    lr=lr, options=options)``, once for a plain-tensor copy of a small float64 module
    and once per layout of :data:`LAYOUTS`; every copy gets the same gradients for
    ``steps`` steps."""
    resolved = resolve("optimizer", optimizer, options, extra_plugins)
    build, label = resolved.impl, resolved.label

    def make(named: list[NamedParameter]) -> Any:
        return build(named_params=named, lr=lr, options=resolved.options)

    torch.manual_seed(seed)
    plain = _Module().double()
    grads = _gradients(plain, steps, seed)
    initial = {name: p.detach().clone() for name, p in plain.named_parameters()}
    named = _named(plain)
    _step_all(make(named), named, grads, lambda name, g: g.clone())
    want = {name: p.detach() for name, p in plain.named_parameters()}
    worst = 0.0
    with one_process_group():
        for layout, shape, matrix, vector in LAYOUTS:
            mesh = init_device_mesh("cpu", shape)

            def place(name: str, tensor: torch.Tensor, mesh: Any = mesh, m=matrix, v=vector) -> DTensor:
                # A copy: on one rank the DTensor's local shard may share the tensor's storage.
                return distribute_tensor(tensor.clone(), mesh, m if tensor.dim() > 1 else v)

            sharded = _Module().double()
            for name in [name for name, _ in sharded.named_parameters()]:
                module_name, _, attr = name.rpartition(".")
                setattr(
                    sharded.get_submodule(module_name), attr, torch.nn.Parameter(place(name, initial[name]))
                )
            named = _named(sharded)
            try:
                stepped = make(named)
                _step_all(stepped, named, grads, place)
            except Exception as exc:
                raise _hazard(label, layout, exc) from exc
            _check_state(label, stepped, named, layout)
            for p in named:
                worst = max(
                    worst,
                    assert_within_rounding(
                        p.param.full_tensor(),
                        want[p.name],
                        dtype=torch.float64,
                        terms=max(p.param.shape) * steps,
                        what=f"{label}: parameter {p.name!r} after {steps} steps laid out as {layout}, "
                        "against the same steps on plain tensors",
                    ),
                )
    return OptimizerReport(tuple(layout for layout, *_ in LAYOUTS), steps, worst)
