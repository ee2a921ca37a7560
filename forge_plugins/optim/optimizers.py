"""Optimizer factories: AdamW (fused or foreach) and SGD. Both take the parameters as
:class:`~forge_core.components.named_params.NamedParameter` and keep weight decay off biases,
norms and other vectors (and off embeddings with ``decay_embeddings: false``): see
:func:`forge_plugins.optim.groups.decay_groups`."""

from __future__ import annotations

import torch

from forge_plugins.optim.groups import decay_groups


def _on_cuda(groups: list[dict]) -> bool:
    return any(p.is_cuda for g in groups for p in g["params"])


def build_adamw(named_params, lr: float, options) -> torch.optim.Optimizer:
    groups = decay_groups(named_params, options.weight_decay, options.decay_embeddings)
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


def build_sgd(named_params, lr: float, options) -> torch.optim.Optimizer:
    groups = decay_groups(named_params, options.weight_decay, options.decay_embeddings)
    return torch.optim.SGD(groups, lr=lr, momentum=options.momentum, nesterov=options.nesterov)
