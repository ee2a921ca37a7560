"""Parameter groups of the built-in optimizers: weight decay where the declared rule of
:mod:`forge_core.components.named_params` says, none elsewhere."""

from __future__ import annotations

from typing import Any


def decay_groups(named_params: list[Any], weight_decay: float, decay_embeddings: bool) -> list[dict]:
    """``torch.optim`` param groups, each in the order parameters came:
    ``{"params": [...], "weight_decay": weight_decay}`` for the parameters that decay
    (``NamedParameter.decays``), ``{"params": [...], "weight_decay": 0.0}`` for the
    others. No other keys: every key of a group is saved per parameter in checkpoints.

    Under tensor parallelism a group can hold sharded parameters (DTensors) beside plain
    ones (a replicated position table, a norm beside a row-wise layer's sharded bias):
    such a group is split in two, DTensors first, because torch's foreach and fused
    kernels refuse to mix them (``aten._foreach_mul_ got mixed torch.Tensor and
    DTensor``). Otherwise there are at most two groups."""
    decay = [p.param for p in named_params if p.decays(embeddings=decay_embeddings)]
    rest = [p.param for p in named_params if not p.decays(embeddings=decay_embeddings)]
    groups = []
    for members, rate in ((decay, weight_decay), (rest, 0.0)):
        groups += [{"params": part, "weight_decay": rate} for part in _unmixed(members) if part]
    return groups


def _unmixed(members: list[Any]) -> list[list[Any]]:
    from torch.distributed.tensor import DTensor

    sharded = [p for p in members if isinstance(p, DTensor)]
    plain = [p for p in members if not isinstance(p, DTensor)]
    return [sharded, plain] if sharded and plain else [members]
