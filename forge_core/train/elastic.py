"""Resuming a checkpoint on another number of processes ("elastic resume").

What carries over exactly:

- model and optimizer state: written and read through DCP by parameter name, so any
  layout reads any other (DCP reshards on load);
- the data order: the loader's position is counted in *global* batches of
  ``train.batch_size / train.grad_accum`` rows, the same on every process and for any
  data-parallel degree (:mod:`forge_core.data.loader`); with the same ``batch_size`` and
  ``grad_accum`` every optimizer step reads the same rows as the run that saved it;
- the step, the non-finite counter and the schedule span (the same on every process).

What cannot: the random number streams (Python, NumPy, torch CPU and CUDA) are per
process and cannot be split or merged. Process ``r`` continues those of the saved
process ``r mod N`` (``N`` processes saved the checkpoint). Forge's own training draws
nothing at random after the build, so losses match an uninterrupted run up to the
rounding of sums (another process count adds partial sums in another order); a model or
plugin that draws at random during training (dropout) draws differently from there on.
"""

from __future__ import annotations

from typing import Any


def source_rank(rank: int, saved_world: int) -> int:
    """Whose per-process train state process ``rank`` continues."""
    return rank % saved_world


def _processes(first: int, last: int) -> str:
    return f"process {first}" if first == last else f"processes {first}-{last}"


def notice(path: Any, saved_world: int, world: int) -> str:
    """What a resume from ``saved_world`` processes on ``world`` says."""
    if world > saved_world:
        verb = "starts" if world - saved_world == 1 else "start"
        streams = (
            f"{_processes(saved_world, world - 1)} {verb} from copies of the streams of "
            f"{_processes(0, saved_world - 1)} (process r takes those of process r mod {saved_world})"
        )
    else:
        streams = (
            f"the streams of {_processes(0, world - 1)} go on, those of "
            f"{_processes(world, saved_world - 1)} are dropped"
        )
    return (
        f"checkpoint {path} was written by {saved_world} process{'es' * (saved_world > 1)}; resuming on "
        f"{world}. Model and optimizer state are resharded, and the data goes on at the same global batch. "
        f"Random number streams are per process and cannot carry over: {streams}, so anything drawn at "
        f"random from here on (dropout, sampling in plugins) differs from an uninterrupted run; losses "
        f"match it up to the rounding of sums."
    )
