"""``cp``: context parallelism. The model is untouched; the declared batch transform cuts
every batch to this rank's share of each row (:mod:`~forge_plugins.context_parallel.shard`) and the attention
backend, wrapped before the model is built
(:mod:`~forge_plugins.context_parallel.attention`), sees the rest of the row through the
cp group. Gradients are summed over the cp ranks by FSDP, which shards over
``dp_shard x cp`` (the dimension declares it shards with ``dp_shard``)."""

from __future__ import annotations

from typing import Any

from forge_plugins.context_parallel.shard import shard_batch


class ContextParallel:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: Any, ctx: Any) -> Any:
        return model

    def batch_transform(self, ctx: Any) -> Any:
        cp = ctx.mesh["cp"]
        rank, size, balance = cp.get_local_rank(), cp.size(), self.options.balance
        return lambda batch: shard_batch(batch, rank, size, balance)


def wrap_attention(backend: Any, ctx: Any) -> Any:
    """The attention backend the model gets: ``backend`` seeing the whole row through the
    cp group (``ctx``: an :class:`~forge_core.api.AttentionContext`); itself at size 1."""
    if ctx.size == 1:
        return backend
    from forge_plugins.context_parallel.attention import ContextParallelAttention

    return ContextParallelAttention(backend, ctx)
