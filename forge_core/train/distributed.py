"""Process placement: which device this process trains on and, when it was started by
``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment), the process group.

gloo on CPU, nccl on CUDA. A single process never creates a process group: everything
downstream (checkpointing included) works without one.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import torch
import torch.distributed as dist

from forge_core.api import ForgeError
from forge_core.parallel_dims import launched_by_torchrun


@attrs.frozen
class Placement:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

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


def setup(requested_device: str) -> Placement:
    """Choose the device and, under torchrun with more than one process, join the group."""
    if not launched_by_torchrun():
        return Placement(0, 0, 1, choose_device(requested_device))
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = choose_device(requested_device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"backend": backend}
        if device.type == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group(**kwargs)
    return Placement(rank, local_rank, world_size, device)


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
