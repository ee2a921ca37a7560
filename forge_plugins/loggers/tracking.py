"""What the experiment-tracker loggers (``tensorboard``, ``wandb``, ``mlflow``) share:
metric names, the config as hyperparameters, the tracker's run id kept in the run
directory (so a resumed run continues the same tracked run), the loss plot, the
warning for a package that is not installed, and what a tracker that cannot start its
run does (``unreachable``: stop the run before its first step, or warn and go on).

Metric names: a key with a ``/`` (``eval/loss``) is logged as it is; any other key
(``loss``) as ``train/<key>``. Every numeric value is forwarded (``True``/``False``
as 1/0), whatever its key, so metrics added later reach the trackers unchanged.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from forge_core.api import ForgeError
from forge_core.api.unstable import atomic_write
from forge_plugins.loggers.plot import LossPoints, write_plot

TRAIN_PREFIX = "train/"


def metric_name(key: str) -> str:
    return key if "/" in key else TRAIN_PREFIX + key


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """``{tracker name: float}`` for every number in ``metrics``."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)):
            out[metric_name(key)] = float(value)
    return out


def plain_config(config: Any) -> dict[str, Any]:
    """The resolved config as nested plain data (what ``config.yaml`` holds)."""
    return attrs.asdict(config, recurse=True)


def flat_config(config: Any) -> dict[str, str | int | float | bool]:
    """The resolved config as ``{"train.lr": 0.0003, ...}``: scalars as they are, lists
    and ``None`` as JSON text (what hyperparameter tables accept)."""
    flat: dict[str, Any] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(inner, f"{prefix}.{key}" if prefix else str(key))
        elif isinstance(value, (bool, int, float, str)):
            flat[prefix] = value
        else:
            flat[prefix] = json.dumps(value)

    walk(plain_config(config), "")
    return flat


def missing(name: str) -> None:
    """The warning of a logger whose package (of the same name as the logger and its
    extra) is not installed."""
    print(
        f"warning: the {name} logger needs the {name} package (pip install 'forge-trainer[{name}]'); "
        f"training goes on without it",
        file=sys.stderr,
        flush=True,
    )


def cannot_start(name: str, options: Any, what: str, reason: str, fix: str) -> None:
    """A tracker that cannot start its run: a :class:`ForgeError` before the first step
    (``unreachable: stop``), or a warning and the run goes on without it (``warn``)."""
    if options.unreachable == "warn":
        print(
            f"warning: the {name} logger could not start {what}: {reason}; training goes on without it "
            f"(logging.options.{name}.unreachable: warn)",
            file=sys.stderr,
            flush=True,
        )
        return
    raise ForgeError(
        f"the {name} logger could not start {what}: {reason}. {fix}, or set "
        f"logging.options.{name}.unreachable: warn to train without it, or drop {name!r} from "
        f"logging.loggers."
    )


# --- the tracked run's id, kept in the run directory ------------------------------


def read_run_id(path: Path) -> dict[str, Any] | None:
    """What :func:`write_run_id` stored, or ``None`` (absent, or unreadable: warned)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"warning: cannot read {path} ({exc}); starting a new tracked run", file=sys.stderr, flush=True)
        return None
    return data if isinstance(data, dict) and isinstance(data.get("run_id"), str) else None


def write_run_id(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically (a torn file would lose the tracked run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1) + "\n")


# --- the loss plot --------------------------------------------------------------


class LossCurve(LossPoints):
    """The losses of the whole run (:class:`~forge_plugins.loggers.plot.LossPoints`),
    drawn into a PNG for a tracker to store."""

    @contextmanager
    def png(self, title: str) -> Iterator[Path | None]:
        """A temporary ``loss.png`` of the curve, or ``None`` (no finite loss, or no
        matplotlib: warned)."""
        if not any(math.isfinite(v) for v in self.points.values()):
            yield None
            return
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "warning: no loss-plot artifact without matplotlib (pip install matplotlib)",
                file=sys.stderr,
                flush=True,
            )
            yield None
            return

        with tempfile.TemporaryDirectory(prefix="forge-loss-") as tmp:
            path = Path(tmp) / "loss.png"
            write_plot(path, self.points, 0, title=title, eval_points=self.eval_points)
            yield path
