"""Optimizer factories: AdamW (fused or foreach) and SGD, with weight decay kept off
norms, biases and other 1-D parameters."""

from __future__ import annotations

import torch


def split_decay(params, weight_decay: float) -> list[dict]:
    """Two param groups: matrices decay, vectors (norm weights, biases) do not."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


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
