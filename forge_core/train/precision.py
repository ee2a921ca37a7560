"""``train.precision``: what bf16 autocast needs from the hardware, and the autocast
context the trainer runs forward and loss under.

bf16 autocast runs the matmuls in bf16 and keeps parameters, gradients, optimizer state,
the loss and the norms in fp32 (:mod:`forge_core.train.loss` casts the logits to at
least fp32; the built-in RMSNorm computes in fp32). It pays only where the hardware
computes in bf16: a CUDA GPU that supports it, or a CPU with AVX512_BF16 or AMX. On
other CPUs PyTorch emulates bf16 through fp32 conversions, slower than fp32 and less
accurate, so the run stops with an error instead. ``forge-run check`` says so first,
from the CPU flags without torch (rules ``train.bf16-on-cpu``, ``train.bf16-on-auto-device``,
:mod:`forge_core.hardware`).
"""

from __future__ import annotations

import contextlib

import torch

from forge_core.api import ForgeError


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (x86: AVX512_BF16 or AMX-BF16; Arm:
    the BF16 extension), as PyTorch's CPU feature detection reports it."""
    capabilities = torch.cpu.get_capabilities()
    return any(bool(value) for key, value in capabilities.items() if "bf16" in key.lower())


def check_precision(precision: str, device: torch.device) -> None:
    """A ForgeError naming ``train.precision`` and the fix when ``device`` cannot run it."""
    if precision != "bf16":
        return
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            raise ForgeError(
                f"train.precision: bf16, but GPU {torch.cuda.get_device_name(device)!r} does not "
                "support bf16. Set train.precision: fp32."
            )
        return
    if device.type == "cpu" and not cpu_has_bf16():
        raise ForgeError(
            "train.precision: bf16, but this CPU has no native bf16 arithmetic (neither AVX512_BF16 nor AMX; "
            f"PyTorch reports kernel level {torch.backends.cpu.get_cpu_capability()}): bf16 would be "
            "emulated, slower than fp32. Set train.precision: fp32, or train on a CPU or GPU with bf16."
        )


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` for ``bf16``; nothing for ``fp32``."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
