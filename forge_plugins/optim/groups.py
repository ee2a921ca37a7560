"""Parameter groups of the built-in optimizers: weight decay where the declared rule of
:mod:`forge_core.train.named_params` says, none elsewhere."""

from __future__ import annotations

from typing import Any


def decay_groups(named_params: list[Any], weight_decay: float, decay_embeddings: bool) -> list[dict]:
    """At most two ``torch.optim`` param groups, each in the order parameters came:
    ``{"params": [...], "weight_decay": weight_decay}`` for the parameters that decay
    (``NamedParameter.decays``), ``{"params": [...], "weight_decay": 0.0}`` for the
    others. No other keys: every key of a group is saved per parameter in checkpoints."""
    decay = [p for p in named_params if p.decays(embeddings=decay_embeddings)]
    rest = [p for p in named_params if not p.decays(embeddings=decay_embeddings)]
    groups = []
    for members, rate in ((decay, weight_decay), (rest, 0.0)):
        if members:
            groups.append({"params": [p.param for p in members], "weight_decay": rate})
    return groups
