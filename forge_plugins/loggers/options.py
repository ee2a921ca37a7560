"""Options of the built-in loggers (``logging.options.<name>``). Light on purpose:
imported by ``forge-run check``."""

from __future__ import annotations

import attrs

from forge_core.api import at_least, relative_path


def _opt(default, doc, validator=None):
    return attrs.field(default=default, metadata={"doc": doc}, validator=validator)


@attrs.frozen
class ConsoleOptions:
    bar: bool = _opt(True, "Show a tqdm progress bar; false prints one line per logged step instead.")


@attrs.frozen
class JsonlOptions:
    filename: str = _opt(
        "metrics.jsonl", "File in the run directory; one JSON object per logged step.", relative_path
    )


@attrs.frozen
class TensorBoardOptions:
    log_dir: str = _opt("tensorboard", "Event directory, relative to the run directory.", relative_path)


@attrs.frozen
class PlotOptions:
    filename: str = _opt("loss.png", "PNG written in the run directory when the run ends.", relative_path)
    smooth: int = _opt(
        0, "Also draw a moving average over this many steps (0: off; auto when the run is long).",
        at_least(0),
    )
