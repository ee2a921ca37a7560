"""Rules of the built-in loggers: the files they write in the run directory must be
writable there. A rule, not a validator: it looks at what is on disk now."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge_plugins.loggers.options import JsonlOptions, PlotOptions, ProfilerOptions, TensorBoardOptions

OUTPUT_PATHS = "loggers.output-paths"
PROFILER_RANGE = "loggers.profiler-range"

#: Built-in logger -> (its options class, the option naming what it writes, a directory?).
_OUTPUTS = {
    "jsonl": (JsonlOptions, "filename", False),
    "plot": (PlotOptions, "filename", False),
    "tensorboard": (TensorBoardOptions, "log_dir", True),
    "profiler": (ProfilerOptions, "log_dir", True),
}


def check_output_paths(ctx: Any) -> list[str]:
    problems = []
    run_dir = Path(ctx.config.run.out_dir)
    for name in ctx.config.logging.loggers:
        if name not in _OUTPUTS:
            continue
        cls, option, is_dir = _OUTPUTS[name]
        options = ctx.config.logging.options.get(name) or cls()
        target = run_dir / getattr(options, option)
        wrong = target.exists() and (target.is_dir() != is_dir)
        if wrong:
            want = "a directory" if is_dir else "a file"
            problems.append(
                f"logger {name!r} writes {target} (logging.options.{name}.{option}), which exists "
                f"and is not {want}"
            )
    return problems


def check_profiler_range(ctx: Any) -> list[str]:
    if "profiler" not in ctx.config.logging.loggers:
        return []
    o = ctx.config.logging.options.get("profiler") or ProfilerOptions()
    problems = []
    steps = ctx.config.train.steps
    if o.start_step > steps:
        problems.append(
            f"the profiler starts at step {o.start_step} (logging.options.profiler.start_step), "
            f"after the last step ({steps}, train.steps): nothing will be profiled"
        )
    missing = [r for r in o.ranks if ctx.world_size is not None and r >= ctx.world_size]
    if missing:
        problems.append(
            f"logging.options.profiler.ranks lists {missing}, but the run has {ctx.world_size} "
            f"process{'es' * (ctx.world_size > 1)} (ranks 0-{ctx.world_size - 1})"
        )
    return problems


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=OUTPUT_PATHS,
            severity="error",
            paths=("run.out_dir", "logging.loggers"),
            summary="What each enabled built-in logger writes in the run directory can be written there.",
            check=check_output_paths,
            fix="Remove what is in the way, or choose another file name in logging.options.<logger>.",
        ),
        Rule(
            id=PROFILER_RANGE,
            severity="warning",
            paths=("logging.options.profiler.start_step", "logging.options.profiler.ranks", "train.steps"),
            summary="The profiler's steps and ranks exist in the run.",
            check=check_profiler_range,
            fix="Lower logging.options.profiler.start_step, or list ranks below the world size.",
        ),
    ]
