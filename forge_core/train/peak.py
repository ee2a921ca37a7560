"""The peak FLOP/s MFU is measured against.

``train.peak_tflops`` wins when set. Otherwise the peak is measured once: the best of a
few timed square matmuls in the training dtype, for about a second, and cached in
``~/.cache/forge/peak_flops.json`` (``$FORGE_CACHE_DIR`` or ``$XDG_CACHE_HOME/forge``
when set), keyed by device name, thread count and dtype, so later runs start at once.

A figure measured while other programs competed for the cores is too low: MFU then
reads above 1, and the run says so (:mod:`forge_core.train.mfu`); deleting the cache
file (:func:`cache_file`) measures again at the next start.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from forge_core.api.files import atomic_write


def cache_dir() -> Path:
    if os.environ.get("FORGE_CACHE_DIR"):
        return Path(os.environ["FORGE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "forge"


def cache_file() -> Path:
    return cache_dir() / "peak_flops.json"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cache_key(device: torch.device, dtype: torch.dtype) -> str:
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    return f"{device.type}|{device_name(device)}|threads={threads}|{str(dtype).replace('torch.', '')}"


def time_matmul(device: torch.device, dtype: torch.dtype, size: int, budget_s: float) -> float:
    """Best observed FLOP/s of ``size x size`` matmuls within about ``budget_s`` seconds."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b)  # warm-up: thread pool, kernel selection
    sync()
    best = 0.0
    deadline = time.perf_counter() + budget_s
    while True:
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        elapsed = time.perf_counter() - t0
        best = max(best, 2.0 * size**3 / elapsed)
        if time.perf_counter() > deadline:
            return best


def cached_peak(device: torch.device, dtype: torch.dtype) -> float | None:
    try:
        value = json.loads((cache_file()).read_text()).get(cache_key(device, dtype))
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def store_peak(device: torch.device, dtype: torch.dtype, value: float) -> Path:
    """Write ``value`` as the cached peak for this device, thread count and dtype."""
    path = cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    cached = cached if isinstance(cached, dict) else {}
    cached[cache_key(device, dtype)] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(cached, indent=1, sort_keys=True))
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
    return path


def peak_flops(
    device: torch.device,
    dtype: torch.dtype,
    configured_tflops: float = 0.0,
    size: int | None = None,
    budget_s: float = 1.0,
) -> tuple[float, str]:
    """``(peak FLOP/s, where the figure came from)``."""
    if configured_tflops > 0:
        return configured_tflops * 1e12, "train.peak_tflops"
    path = cache_file()
    cached = cached_peak(device, dtype)
    if cached is not None:
        return cached, f"cached in {path}"
    if size is None:
        size = 8192 if device.type == "cuda" else 2048
    value = time_matmul(device, dtype, size, budget_s)
    store_peak(device, dtype, value)
    return value, f"measured ({size}x{size} matmul), cached in {path}"
