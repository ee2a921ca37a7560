"""Process placement: which device this process trains on and, when it was started by
``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment), the process group.

gloo on CPU, nccl on CUDA. A single process never creates a process group: everything
downstream (checkpointing included) works without one.

Every collective may wait ``run.collective_timeout`` seconds for the other processes
(0 picks :data:`DEFAULT_TIMEOUTS`: short on CPU, where nothing legitimately takes minutes
between two collectives of a step, torch's NCCL default on CUDA). When one runs out,
:func:`collective_failure` turns gloo's error into a message that says a process stopped
answering; under NCCL the watchdog ends the process and ``forge-run``'s agent names the
rank that stopped.
"""

from __future__ import annotations

import datetime
from typing import Any

import attrs
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from forge_core.api import ForgeError
from forge_core.errors import CollectiveTimeout, ProcessLost
from forge_core.parallel_dims import launched_by_torchrun, torchrun_place

#: Seconds a collective waits when ``run.collective_timeout`` is 0, by backend.
DEFAULT_TIMEOUTS = {"gloo": 300.0, "nccl": 600.0}

#: Lower-case fragments of the errors a collective raises (gloo's wording).
_TIMED_OUT = ("timed out", "timeout")
_PEER_GONE = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
    "socket closed",
)


@attrs.frozen
class Placement:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    #: Seconds a collective may wait for the other processes (0 alone: there are none).
    collective_timeout: float = 0.0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def choose_device(requested: str, local_rank: int = 0) -> torch.device:
    """``auto``: CUDA when available, else CPU. ``cuda`` without a GPU is a user error."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ForgeError(
                "run.device is 'cuda' but no CUDA device is available to this PyTorch "
                f"(torch {torch.__version__}). Use run.device: cpu (or --device cpu), or 'auto'."
            )
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def resolve_timeout(backend: str, configured: float) -> float:
    """``run.collective_timeout`` in seconds, 0 resolved to the backend's default."""
    return float(configured) if configured > 0 else DEFAULT_TIMEOUTS.get(backend, DEFAULT_TIMEOUTS["nccl"])


def setup(requested_device: str, collective_timeout: float = 0.0) -> Placement:
    """Choose the device and, under torchrun with more than one process, join the group
    with every collective bounded by ``collective_timeout`` seconds (0: the default)."""
    if not launched_by_torchrun():
        return Placement(0, 0, 1, choose_device(requested_device))
    rank, world_size, local_rank = torchrun_place()
    device = choose_device(requested_device, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    seconds = resolve_timeout(backend, collective_timeout) if world_size > 1 else 0.0
    if world_size > 1 and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=seconds)
        # Groups created later (the device mesh's dimensions) take torch's module-level
        # default, not the default group's timeout: make that ours too.
        c10d.default_pg_timeout = timeout
        c10d.default_pg_nccl_timeout = timeout
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
        if device.type == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    return Placement(rank, local_rank, world_size, device, seconds)


def collective_failure(exc: BaseException, placement: Placement) -> ForgeError | None:
    """A clear error for a collective that timed out or lost its peer, else ``None``."""
    if not isinstance(exc, RuntimeError) or placement.world_size < 2:
        return None
    text = str(exc)
    low = text.lower()
    if not (isinstance(exc, dist.DistError) or "gloo" in low or "nccl" in low):
        return None  # not raised by a collective
    rank = placement.rank
    others = (
        "rank 1"
        if placement.world_size == 2 and rank == 0
        else ("rank 0" if placement.world_size == 2 else "another process")
    )
    if any(fragment in low for fragment in _TIMED_OUT):
        return CollectiveTimeout(
            f"rank {rank}: a collective got no answer within run.collective_timeout = "
            f"{placement.collective_timeout:g} s: {others} stopped answering (it hangs, was "
            f"stopped, or is far slower than this one). forge-run names the rank it found "
            f"stopped; if a step legitimately takes longer, raise run.collective_timeout. "
            f"({text.strip().splitlines()[0]})"
        )
    if any(fragment in low for fragment in _PEER_GONE):
        return ProcessLost(
            f"rank {rank}: lost the connection to {others} during a collective: it ended or "
            f"was killed. ({text.strip().splitlines()[0]})"
        )
    return None


def teardown() -> None:
    if is_distributed():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few floats over every process; identity alone."""
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(values: list[float], device: torch.device) -> list[float]:
    """The largest of a few floats over every process; identity alone."""
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every process."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` alone)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of a batch on ``device`` (without waiting, where the device allows)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
