"""Peak memory of a run, as figures in the step metrics.

Keys (GiB, 2**30 bytes), each for this process and, with ``_max``, the largest over
every process of the run (one small all-reduce per step):

- ``mem_rss_peak_gib`` / ``mem_rss_peak_gib_max``: the resident-memory high-water
  mark of the process since it started (``VmHWM`` in ``/proc/self/status``, else
  ``getrusage``'s ``ru_maxrss``). Cumulative: the operating system keeps it and it
  cannot be reset portably, so it never falls during a run.
- ``mem_rss_anon_gib`` / ``mem_rss_anon_gib_max`` (Linux): the anonymous resident
  memory now (``RssAnon``): what the process itself holds (heap, tensors, arrays),
  without the file-backed pages of the memory-mapped token cache and the libraries,
  which the kernel can drop and read back. A corpus read through memory maps grows the
  peak above by the pages it touched, not this.
- on CUDA, ``mem_cuda_allocated_peak_gib`` / ``mem_cuda_reserved_peak_gib`` (and their
  ``_max``): the peak of ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``
  over the current *logging window*, i.e. since the previous logged step
  (``logging.every``): :meth:`MemoryMeter.next_window` resets the peaks after each
  logged step, so every logged figure covers the steps since the last one and nothing
  between two logged steps is missed. The process-wide peak is the largest value logged.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

from forge_core.distributed.placement import all_reduce_max

GIB = float(2**30)
RSS = "mem_rss_peak_gib"
ANON = "mem_rss_anon_gib"
CUDA_ALLOCATED = "mem_cuda_allocated_peak_gib"
CUDA_RESERVED = "mem_cuda_reserved_peak_gib"
#: Suffix of the largest value over all processes.
MAX = "_max"


def _status_bytes() -> dict[str, int]:
    """``VmHWM`` and ``RssAnon`` of ``/proc/self/status`` that it has, in bytes."""
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key = line.split(":", 1)[0]
            if key in ("VmHWM", "RssAnon"):
                out[key] = int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        pass
    return out


def peak_rss_bytes(status: dict[str, int] | None = None) -> int:
    """This process's resident-memory high-water mark, in bytes."""
    status = _status_bytes() if status is None else status
    if "VmHWM" in status:
        return status["VmHWM"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


class MemoryMeter:
    """Measures the figures above once per step; every process must call
    :meth:`measure` at the same steps (it takes part in an all-reduce)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.next_window()

    def measure(self) -> dict[str, float]:
        status = _status_bytes()  # one read for both figures
        local = {RSS: peak_rss_bytes(status) / GIB}
        if "RssAnon" in status:
            local[ANON] = status["RssAnon"] / GIB
        if self.cuda:
            local[CUDA_ALLOCATED] = torch.cuda.max_memory_allocated(self.device) / GIB
            local[CUDA_RESERVED] = torch.cuda.max_memory_reserved(self.device) / GIB
        largest = all_reduce_max(list(local.values()), self.device)
        return {**local, **{key + MAX: value for key, value in zip(local, largest)}}

    def next_window(self) -> None:
        """Start a new logging window for the CUDA peaks."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
