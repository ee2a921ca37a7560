"""How pipeline parallelism splits the layers over stages and places the stages on
ranks (pure arithmetic, no torch: the rules use it too).

``pp * virtual_stages`` stages share the model's blocks in order. Every stage gets
``blocks // stages`` of them and the first ``blocks % stages`` stages get one more:
the first stage also embeds tokens and the last one runs the final norm and the output
head, which on real vocabularies is the heaviest piece, so the remainder goes to the
front.

Placement depends on the schedule. Loop style (every schedule but the V-shaped ones):
stage ``s`` lives on pipeline rank ``s % pp`` (rank 0 holds stages 0, pp, 2*pp, ...),
so the last stage is on rank ``pp - 1``. V style (``zbv_zero_bubble``, ``dualpipev``:
exactly two stages per rank): rank ``r`` holds stages ``r`` and ``2*pp - 1 - r``, so the
first AND the last stage are on rank 0.
"""

from __future__ import annotations

#: Schedules that run one stage per rank.
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")
#: Schedules that run several stages per rank, placed loop style.
LOOP_SCHEDULES = ("interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble")
#: Schedules that run exactly two stages per rank, placed V style.
V_SCHEDULES = ("zbv_zero_bubble", "dualpipev")
#: Schedules whose backward is split into an input pass and a later weight pass.
SPLIT_BACKWARD_SCHEDULES = ("interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev")
SCHEDULES = SINGLE_STAGE_SCHEDULES + LOOP_SCHEDULES + V_SCHEDULES


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


def stages_of_rank(pp_rank: int, pp: int, virtual_stages: int, schedule: str = "1f1b") -> list[int]:
    """The stage indices pipeline rank ``pp_rank`` holds, in the order the schedule
    expects them (ascending)."""
    if schedule in V_SCHEDULES:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + i * pp for i in range(virtual_stages)]


def rank_of_stage(stage: int, pp: int, schedule: str = "1f1b") -> int:
    """The pipeline rank that holds ``stage`` (the inverse of :func:`stages_of_rank`)."""
    if schedule in V_SCHEDULES:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def microbatches(options: object, pp: int) -> int:
    """Microbatches per pipeline step: ``parallel.options.pp.microbatches``, or (0) one
    per stage, ``pp * virtual_stages``."""
    return options.microbatches or pp * options.virtual_stages  # type: ignore[attr-defined]
