"""How pipeline parallelism splits the layers over stages (pure arithmetic, no torch).

``pp * virtual_stages`` stages share the model's blocks in order. Every stage gets
``blocks // stages`` of them and the first ``blocks % stages`` stages get one more:
the first stage also embeds tokens and the last one runs the final norm and the output
head, which on real vocabularies is the heaviest piece, so the remainder goes to the
front. Under interleaving, stage ``s`` lives on pipeline rank ``s % pp`` (rank 0 holds
stages 0, pp, 2*pp, ...).
"""

from __future__ import annotations


def stage_layer_ranges(n_blocks: int, n_stages: int) -> list[range]:
    """The block indices of each stage, in stage order."""
    if n_stages < 1 or n_blocks < n_stages:
        raise ValueError(
            f"cannot split {n_blocks} layers over {n_stages} pipeline stages: every stage "
            "needs at least one layer"
        )
    base, extra = divmod(n_blocks, n_stages)
    ranges, start = [], 0
    for stage in range(n_stages):
        size = base + (1 if stage < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def stages_of_rank(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    """The stage indices pipeline rank ``pp_rank`` holds (loop order)."""
    return [pp_rank + i * pp for i in range(virtual_stages)]


def microbatches(options: object, pp: int) -> int:
    """Microbatches per pipeline step: ``parallel.options.pp.microbatches``, or one per rank."""
    return options.microbatches or pp  # type: ignore[attr-defined]
