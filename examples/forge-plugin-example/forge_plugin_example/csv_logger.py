"""``csv``: one CSV row per logged step in ``<run directory>/metrics.csv``.

A logger is a plain object whose methods are lifecycle hook implementations: Forge
constructs it as ``cls(options)`` when ``logging.loggers`` lists ``csv`` and registers
it with the plugin manager for the length of the run. Hooks are called on every
process; only the main process writes. The columns are those of the first logged step
(``step``, then the metric names in the order the trainer gives them); a resumed run
appends to the file.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from forge_core.api import hookimpl


class CsvLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.file = None
        self.writer = None

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        path = Path(run.out_dir) / self.options.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", newline="", encoding="utf-8")

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.file is None or not run.should_log(step):
            return
        row = {"step": step, **metrics}
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(row), extrasaction="ignore")
            if self.file.tell() == 0:
                self.writer.writeheader()
        self.writer.writerow(row)
        self.file.flush()

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.file is not None:
            self.file.close()
            self.file = None
            self.writer = None
