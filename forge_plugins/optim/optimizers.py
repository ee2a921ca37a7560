"""Optimizer factories: AdamW (fused or foreach) and SGD, with weight decay kept off
norms, biases and other 1-D parameters."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def split_decay(params, weight_decay: float) -> list[dict]:
    """Two param groups: matrices decay, vectors (norm weights, biases) do not.

    Under tensor parallelism a group can hold sharded parameters (DTensors) beside
    replicated plain ones (a replicated position table, a norm, the bias of a row-wise
    layer is a DTensor): such a group is split in two, DTensors first, because the
    foreach and fused kernels refuse to mix them."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": part, "weight_decay": weight_decay} for part in _unmixed(decay)]
    groups += [{"params": part, "weight_decay": 0.0} for part in _unmixed(no_decay) if part]
    return groups


def _unmixed(members: list) -> list[list]:
    sharded = [p for p in members if isinstance(p, DTensor)]
    plain = [p for p in members if not isinstance(p, DTensor)]
    return [sharded, plain] if sharded and plain else [members]


def _on_cuda(groups: list[dict]) -> bool:
    return any(p.is_cuda for g in groups for p in g["params"])


def build_adamw(params, lr: float, options) -> torch.optim.Optimizer:
    groups = split_decay(params, options.weight_decay)
    kwargs = {}
    impl = options.implementation
    if impl == "auto":
        impl = "fused" if _on_cuda(groups) else "foreach"
    if impl == "fused":
        kwargs["fused"] = True
    elif impl == "foreach":
        kwargs["foreach"] = True
    else:
        kwargs["foreach"] = False
    return torch.optim.AdamW(groups, lr=lr, betas=(options.beta1, options.beta2), eps=options.eps, **kwargs)


def build_sgd(params, lr: float, options) -> torch.optim.Optimizer:
    groups = split_decay(params, options.weight_decay)
    return torch.optim.SGD(groups, lr=lr, momentum=options.momentum, nesterov=options.nesterov)
