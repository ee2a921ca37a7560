"""The ``plot`` logger: a loss-curve PNG (``<run>/loss.png``) written when the run ends,
with the evaluation loss (``eval/loss``) as a second curve when the run evaluates.

Needs matplotlib (Agg backend, no display); without it the run goes on and a warning at
the start says so. After a resume the curve includes the earlier steps, read from the
``jsonl`` logger's file when it exists. The PNG replaces the previous one atomically
(:func:`~forge_core.api.unstable.atomic_write`); when it cannot be written (a full disk) the
run's outcome stands, the previous curve is kept and a warning says why."""

from __future__ import annotations

import importlib.util
import io
import math
import sys
from pathlib import Path
from typing import Any

from forge_core.api import hookimpl
from forge_core.api.unstable import atomic_write


class LossPoints:
    """The training and evaluation losses of the whole run by step, the earlier ones read
    back after a resume: what the loss curve draws, here and for the trackers."""

    def __init__(self) -> None:
        self.points: dict[int, float] = {}
        self.eval_points: dict[int, float] = {}

    def start(self, run: Any) -> None:
        self.points = earlier_points(run)
        self.eval_points = earlier_points(run, EVAL_LOSS)

    def add(self, step: int, metrics: dict[str, Any]) -> None:
        if isinstance(metrics.get("loss"), (int, float)):
            self.points[step] = float(metrics["loss"])
        if isinstance(metrics.get(EVAL_LOSS), (int, float)):
            self.eval_points[step] = float(metrics[EVAL_LOSS])


class PlotLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.enabled = False
        self.curve = LossPoints()

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        # Found, not imported: matplotlib costs half a second of CPU, paid when the run ends.
        if importlib.util.find_spec("matplotlib") is None:
            print(
                "warning: the plot logger needs matplotlib (pip install matplotlib); "
                "no loss curve will be written",
                file=sys.stderr,
                flush=True,
            )
            return
        self.enabled = True
        self.curve.start(run)

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.enabled:
            self.curve.add(step, metrics)

    @hookimpl
    def forge_train_end(self, run, step, status):
        if not self.enabled or not self.curve.points:
            return
        path = Path(run.out_dir) / self.options.filename
        try:
            write_plot(
                path,
                self.curve.points,
                self.options.smooth,
                title=f"{run.config.run.name}: training loss",
                eval_points=self.curve.eval_points,
            )
        except OSError as exc:
            print(
                f"warning: the plot logger cannot write {path} ({exc.strerror or exc}); no loss curve "
                f"this time",
                file=sys.stderr,
                flush=True,
            )
            return
        print(f"forge: loss curve written to {path}", file=sys.stderr, flush=True)


EVAL_LOSS = "eval/loss"


def earlier_points(run: Any, key: str = "loss") -> dict[int, float]:
    """``{step: value of key}`` of the steps before a resumed run's first, read from the
    ``jsonl`` logger's file when it exists; empty for a fresh run."""
    points: dict[int, float] = {}
    if not run.start_step:
        return points
    from forge_plugins.loggers.jsonl import read_metrics

    jsonl = run.config.logging.options.get("jsonl")
    name = getattr(jsonl, "filename", "metrics.jsonl")
    for record in read_metrics(Path(run.out_dir) / name):
        if record["step"] <= run.start_step and isinstance(record.get(key), (int, float)):
            points[record["step"]] = float(record[key])
    return points


def write_plot(
    path: Path, points: dict[int, float], smooth: int, title: str, eval_points: dict[int, float] | None = None
) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    steps = sorted(s for s, v in points.items() if math.isfinite(v))
    losses = [points[s] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, losses, lw=1, alpha=0.5 if len(steps) > 50 else 1.0, label="loss")
    window = smooth or (max(1, len(steps) // 25) if len(steps) > 50 else 0)
    if window > 1 and len(losses) >= window:
        avg = [sum(losses[i - window + 1 : i + 1]) / window for i in range(window - 1, len(losses))]
        ax.plot(steps[window - 1 :], avg, lw=2, label=f"mean of {window}")
    evaluated = sorted(s for s, v in (eval_points or {}).items() if math.isfinite(v))
    if evaluated:
        ax.plot(evaluated, [eval_points[s] for s in evaluated], lw=2, marker="o", ms=3, label="eval/loss")
    if evaluated or (window > 1 and len(losses) >= window):
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    image = io.BytesIO()
    try:
        fig.savefig(image, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    atomic_write(path, image.getvalue())
