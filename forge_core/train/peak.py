"""The peak FLOP/s MFU is measured against, and where that figure came from.

Three sources, in this order:

- ``train.peak_tflops`` when set (above 0);
- on CUDA, the vendor's datasheet figure for the GPU (:data:`DEVICE_TABLE`, dense, by
  ``torch.cuda.get_device_name`` and the matmul dtype); a GPU not in the table has its
  matmul rate measured like a CPU's, by device time;
- on a CPU, the best of a few square matmuls timed by *CPU time* (``time.process_time``),
  measured again at every start for the run's thread count.

Why CPU time: a wall-clock timing taken while other programs compete for the cores reads
the share of the machine the run got, not the machine (16.9 GFLOP/s where one core does
80), and MFU then read above 100%. CPU time counts only the time the matmul was on a core;
the best of several samples discards the ones that shared a core's caches with a
neighbour. Why no cache: the measurement takes a fraction of a second, and a figure kept
across runs outlives what it describes (another thread count, a CPU quota, a torch build),
while a bad one stays bad for every later run of the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import torch


@attrs.frozen
class DeviceEntry:
    """One GPU's dense peak TFLOP/s from its datasheet: ``bf16`` (fp16 is the same),
    ``tf32`` (fp32 matmuls on tensor cores) and ``fp32`` (CUDA cores)."""

    name: str
    bf16: float
    tf32: float
    fp32: float


# Dense figures (the datasheets give tensor-core figures "with sparsity"; these are half of
# those). Sources:
# - NVIDIA H100 Tensor Core GPU datasheet: SXM 989 TF32 / 1,979 BF16 sparse, 67 FP32;
#   PCIe 756 / 1,513 sparse, 51 FP32; NVL 835 / 1,671 sparse, 60 FP32.
# - NVIDIA H200 Tensor Core GPU datasheet: SXM as H100 SXM; NVL 835 / 1,671 sparse, 60 FP32.
# - NVIDIA A100 Tensor Core GPU datasheet (40 and 80 GB, SXM and PCIe alike): TF32 156,
#   BF16 312 dense (312 / 624 sparse), FP32 19.5.
# - NVIDIA HGX B200 datasheet, 8 GPUs: TF32 18 PF, FP16/BF16 36 PF sparse, FP32 600 TF;
#   per GPU 1,125 / 2,250 dense, 75 FP32.
DEVICE_TABLE: tuple[tuple[tuple[str, ...], DeviceEntry], ...] = (
    # (words the lower-cased device name must contain, entry); the first match wins, so the
    # form factors with a word of their own come before the default form of each GPU.
    (("h100", "pcie"), DeviceEntry("NVIDIA H100 PCIe", 756.0, 378.0, 51.0)),
    (("h100", "nvl"), DeviceEntry("NVIDIA H100 NVL", 835.5, 417.5, 60.0)),
    (("h100",), DeviceEntry("NVIDIA H100 SXM", 989.5, 494.5, 67.0)),
    (("h200", "nvl"), DeviceEntry("NVIDIA H200 NVL", 835.5, 417.5, 60.0)),
    (("h200",), DeviceEntry("NVIDIA H200 SXM", 989.5, 494.5, 67.0)),
    (("a100", "pcie", "40gb"), DeviceEntry("NVIDIA A100 PCIe 40GB", 312.0, 156.0, 19.5)),
    (("a100", "pcie"), DeviceEntry("NVIDIA A100 PCIe 80GB", 312.0, 156.0, 19.5)),
    (("a100", "40gb"), DeviceEntry("NVIDIA A100 SXM 40GB", 312.0, 156.0, 19.5)),
    (("a100",), DeviceEntry("NVIDIA A100 SXM 80GB", 312.0, 156.0, 19.5)),
    (("b200",), DeviceEntry("NVIDIA B200", 2250.0, 1125.0, 75.0)),
)

#: Square matmuls a CPU measurement times, and their side.
CPU_SAMPLES = 5
CPU_SIZE = 1024


@attrs.frozen
class Peak:
    """``flops`` (FLOP/s per process) and ``source``, the words the log gives it."""

    flops: float
    source: str


def table_entry(name: str) -> DeviceEntry | None:
    """The datasheet entry of a CUDA device called ``name``; None when not in the table."""
    words = name.lower().replace("-", " ")
    for needed, entry in DEVICE_TABLE:
        if all(word in words for word in needed):
            return entry
    return None


def cuda_matmul_kind(dtype: torch.dtype) -> str:
    """The table column an fp32 or bf16 run's matmuls use: fp32 matmuls run on tensor
    cores as TF32 unless ``torch.set_float32_matmul_precision('highest')`` (the default)."""
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def time_matmuls(
    device: torch.device,
    dtype: torch.dtype,
    size: int,
    samples: int,
    clock: Callable[[], float],
) -> float:
    """Best FLOP/s per core-second of ``samples`` ``size x size`` matmuls, by ``clock``.

    With ``clock`` a process CPU-time clock, a matmul on T threads takes T times its wall
    time when it has every core; the best sample times T is the peak of T threads."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)  # warm-up: thread pool, kernel selection
    sync()
    best = 0.0
    for _ in range(samples):
        t0 = clock()
        torch.mm(a, b)
        sync()
        elapsed = clock() - t0
        if elapsed > 0:  # a coarse clock can read 0: that sample says nothing
            best = max(best, 2.0 * size**3 / elapsed)
    return best


def measure_cpu(
    dtype: torch.dtype,
    threads: int,
    samples: int = CPU_SAMPLES,
    size: int = CPU_SIZE,
    clock: Callable[[], float] | None = None,
) -> Peak:
    """The peak of ``threads`` CPU threads: the best per-core rate of ``samples`` matmuls
    by ``clock`` (the process's CPU time unless given), times ``threads``."""
    per_core = time_matmuls(torch.device("cpu"), dtype, size, samples, clock or time.process_time)
    label = str(dtype).replace("torch.", "")
    return Peak(
        per_core * threads,
        f"measured by CPU time: best of {samples} {size}x{size} {label} matmuls, "
        f"{threads} thread{'s' if threads != 1 else ''}",
    )


def _cuda_event_clock(device: torch.device) -> Callable[[], float]:
    """Seconds of device time, for a GPU the table does not know."""
    start = torch.cuda.Event(enable_timing=True)
    start.record(device=device)

    def clock() -> float:
        now = torch.cuda.Event(enable_timing=True)
        now.record(device=device)
        now.synchronize()
        return start.elapsed_time(now) / 1000.0

    return clock


def peak_flops(device: torch.device, dtype: torch.dtype, configured_tflops: float = 0.0) -> Peak:
    """The run's peak: configured, from the device table, or measured (see the module)."""
    if configured_tflops > 0:
        return Peak(configured_tflops * 1e12, "train.peak_tflops")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        entry = table_entry(name)
        if entry is not None:
            kind = cuda_matmul_kind(dtype)
            return Peak(getattr(entry, kind) * 1e12, f"device table: {entry.name}, dense {kind}")
        rate = time_matmuls(device, dtype, 8192, CPU_SAMPLES, _cuda_event_clock(device))
        return Peak(
            rate, f"measured: best of {CPU_SAMPLES} 8192x8192 matmuls ({name!r} is not in the device table)"
        )
    return measure_cpu(dtype, torch.get_num_threads(), CPU_SAMPLES, CPU_SIZE)
