"""Options of the built-in loggers (``logging.options.<name>``). Light on purpose:
imported by ``forge-run check``."""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import at_least, max_chars, option, relative_path, satisfies


@attrs.frozen
class ConsoleOptions:
    bar: bool = option(True, "Show a tqdm progress bar; false prints one line per logged step instead.")


@attrs.frozen
class JsonlOptions:
    filename: str = option(
        "metrics.jsonl", "File in the run directory; one JSON object per logged step.", relative_path
    )


@attrs.frozen
class TensorBoardOptions:
    log_dir: str = option("tensorboard", "Event directory, relative to the run directory.", relative_path)


@attrs.frozen
class PlotOptions:
    filename: str = option("loss.png", "PNG written in the run directory when the run ends.", relative_path)
    smooth: int = option(
        0,
        "Also draw a moving average over this many steps (0: off; auto when the run is long).",
        at_least(0),
    )


_ranks = satisfies(
    "a list of process ranks (integers, 0 or more)",
    lambda v: (
        isinstance(v, list) and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in v)
    ),
)


@attrs.frozen
class ProfilerOptions:
    start_step: int = option(3, "First step recorded (counting from 1, as the metrics do).", at_least(1))
    steps: int = option(3, "Steps recorded from start_step on.", at_least(1))
    warmup: int = option(
        1,
        "Steps run under the profiler just before start_step and left out of the trace: the "
        "profiler's own start-up cost lands there.",
        at_least(0),
    )
    record_shapes: bool = option(False, "Record the input shapes of every operator.")
    memory: bool = option(
        False,
        "Record memory allocations and frees in the trace; on CUDA also write a memory "
        "snapshot (allocation timeline with stacks) of the recorded steps.",
    )
    with_stack: bool = option(False, "Record the Python stack of every operator (slower, larger trace).")
    ranks: list[int] = option(
        [0], "Processes that profile, each writing its own trace ([] for every process).", _ranks
    )
    log_dir: str = option(
        "profiler", "Directory for the traces, relative to the run directory.", relative_path
    )


#: The trackers' own limits on what a run's fields hold (W&B: a project, run or group
#: name, a tag; MLflow: a tag's key and value); a longer one fails only when the run starts.
_NAME, _WANDB_TAG, _MLFLOW_KEY, _MLFLOW_VALUE = 128, 64, 250, 5000

_tags = satisfies(
    f"a list of strings of 1 to {_WANDB_TAG} characters",
    lambda v: isinstance(v, list) and all(isinstance(t, str) and 0 < len(t) <= _WANDB_TAG for t in v),
)
_string_map = satisfies(
    f"a mapping of strings to strings (keys of at most {_MLFLOW_KEY} characters, values of at "
    f"most {_MLFLOW_VALUE:,})",
    lambda v: (
        isinstance(v, dict)
        and all(
            isinstance(k, str) and isinstance(x, str) and len(k) <= _MLFLOW_KEY and len(x) <= _MLFLOW_VALUE
            for k, x in v.items()
        )
    ),
)


#: What a tracker that cannot start its run (server unreachable, not logged in) does.
_UNREACHABLE_DOC = (
    "When the tracker cannot start its run at the start (no answer within timeout, refused, "
    "not logged in): 'stop' ends the run before its first step with the reason; 'warn' says so "
    "and training goes on without this logger."
)


def _timeout(what: str) -> str:
    return f"Seconds {what} may take at the start before the tracker counts as unreachable."


@attrs.frozen
class WandbOptions:
    project: str = option("", "W&B project ('': run.name).", max_chars(_NAME))
    entity: str = option("", "W&B entity (team or user; '': your default).", max_chars(_NAME))
    name: str = option("", "Display name of the W&B run ('': run.name).", max_chars(_NAME))
    group: str = option("", "W&B group, to gather related runs ('': none).", max_chars(_NAME))
    tags: list[str] = option([], "W&B tags of the run.", _tags)
    mode: Literal["", "online", "offline", "disabled"] = option(
        "", "'offline' writes locally for `wandb sync` later; '': WANDB_MODE, else online."
    )
    timeout: int = option(30, _timeout("starting the W&B run (wandb's init_timeout)"), at_least(1))
    unreachable: Literal["stop", "warn"] = option("stop", _UNREACHABLE_DOC)


@attrs.frozen
class MlflowOptions:
    tracking_uri: str = option(
        "", "Tracking server or store URI ('': MLFLOW_TRACKING_URI, else a SQLite store in <run>/mlflow)."
    )
    experiment: str = option("", "Experiment name ('': run.name); created when missing.", max_chars(_NAME))
    run_name: str = option("", "Name of the MLflow run ('': run.name).", max_chars(_NAME))
    tags: dict[str, str] = option({}, "Tags of the MLflow run.", _string_map)
    timeout: int = option(
        10, _timeout("each request to a tracking server (connecting included, no retries)"), at_least(1)
    )
    unreachable: Literal["stop", "warn"] = option("stop", _UNREACHABLE_DOC)
