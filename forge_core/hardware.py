"""What ``forge-run check`` can tell about this machine's hardware without torch: the
CPU's native bf16 arithmetic (from ``/proc/cpuinfo``) and whether a CUDA GPU is there.

The run itself asks torch (:mod:`forge_core.train.precision`); these answers let check
say the same before any process starts. Where the files do not exist (not Linux) the
answer is "unknown" and the rules that read it stay silent.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Read by :func:`cpu_flags`; tests point these at files of their own.
CPUINFO = Path("/proc/cpuinfo")
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")

#: x86: AVX512_BF16 or AMX-BF16; Arm: the BF16 extension (``Features: ... bf16``).
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags() -> frozenset[str] | None:
    """The CPU feature flags the kernel reports (x86 ``flags``, Arm ``Features``) of the
    first processor, or ``None`` when ``/proc/cpuinfo`` cannot be read."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.lower().split())
    return None


def cpu_has_native_bf16(flags: frozenset[str]) -> bool:
    return bool(flags & BF16_FLAGS)


def cuda_gpu_visible() -> bool | None:
    """Whether an NVIDIA GPU is visible to this process (the driver lists one and
    ``CUDA_VISIBLE_DEVICES`` does not hide them all); ``None`` when that cannot be told
    without torch (no ``/proc``)."""
    if not Path("/proc").is_dir():
        return None
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    try:
        return any(NVIDIA_GPUS.iterdir())
    except OSError:
        return False
