"""How many steps the learning-rate schedule spans, and what a resumed run is told when
that differs from what the run is asked to train.

A schedule is a function of the step and of its span (``total_steps``). The span is
``train.schedule_steps`` when set, else the ``train.steps`` the run *started* with: it
is saved in every checkpoint, so raising ``train.steps`` on resume extends the run
without reshaping the schedule (the learning rate never jumps back up; past the
schedule's end it stays at its final value), and lowering it stops the run early on the
same schedule. Setting ``train.schedule_steps`` re-plans the schedule instead. Either
way the resumed run says, with both learning rates, what happens at its next step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Key of the span in the train state of a checkpoint.
STATE_KEY = "schedule_steps"


def span_at_start(train: Any) -> int:
    return train.schedule_steps or train.steps


def span_on_resume(train: Any, saved: int | None) -> int:
    """The span a resumed run follows: the configured one, else the checkpoint's (a
    checkpoint written before spans were saved followed ``train.steps``)."""
    return train.schedule_steps or saved or train.steps


def resume_notice(train: Any, saved: int | None, step: int, lr_at: Callable[[int, int], float]) -> str | None:
    """What a run resumed after ``step`` steps should be told, or ``None``.
    ``lr_at(span, step)`` is the learning rate at 0-based ``step`` of a schedule
    spanning ``span``."""
    if step >= train.steps:  # nothing left to train: nothing to tell
        return None
    before = saved or train.steps
    span = span_on_resume(train, saved)
    nxt = step + 1  # the next step, counted from 1 as the metrics do

    def change(to: int) -> str:
        return f"the learning rate at step {nxt} goes from {lr_at(before, step):.2e} to {lr_at(to, step):.2e}"

    if span != before:
        return (
            f"the learning-rate schedule now spans {span} steps (train.schedule_steps), not the {before} it "
            f"spanned when this checkpoint was saved: {change(span)}"
        )
    if train.schedule_steps or train.steps == span:
        return None
    if train.steps > span:
        first = max(nxt, span + 1)  # the first step past the schedule's end
        flat = f"steps {first}-{train.steps}" if first < train.steps else f"step {train.steps}"
        return (
            f"train.steps is {train.steps}, the learning-rate schedule spans the {span} steps the run "
            f"started with (train.schedule_steps: 0): {flat} continue at its final learning rate "
            f"{lr_at(span, span - 1):.2e}. To stretch the schedule over {train.steps} steps instead, set "
            f"train.schedule_steps={train.steps} ({change(train.steps)})."
        )
    return (
        f"train.steps is {train.steps}, below the {span} steps the learning-rate schedule spans (those the "
        f"run started with): the run stops at step {train.steps} with the learning rate at "
        f"{lr_at(span, train.steps - 1):.2e}, before the schedule's final {lr_at(span, span - 1):.2e}. "
        f"To end the schedule at step {train.steps}, set train.schedule_steps={train.steps} "
        f"({change(train.steps)})."
    )
