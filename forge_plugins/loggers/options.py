"""Options of the built-in loggers (``logging.options.<name>``). Light on purpose:
imported by ``forge-run check``."""

from __future__ import annotations

import attrs


def _opt(default, doc):
    return attrs.field(default=default, metadata={"doc": doc})


@attrs.frozen
class ConsoleOptions:
    bar: bool = _opt(True, "Show a tqdm progress bar; false prints one line per logged step instead.")


@attrs.frozen
class JsonlOptions:
    filename: str = _opt("metrics.jsonl", "File in the run directory; one JSON object per logged step.")


@attrs.frozen
class TensorBoardOptions:
    log_dir: str = _opt("tensorboard", "Event directory, relative to the run directory.")


@attrs.frozen
class PlotOptions:
    filename: str = _opt("loss.png", "PNG written in the run directory when the run ends.")
    smooth: int = _opt(0, "Also draw a moving average over this many steps (0: off; auto when the run is long).")
