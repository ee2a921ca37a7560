"""The ``tensorboard`` logger: every metric as a scalar under ``<run>/tensorboard``.

Needs the ``tensorboard`` package; without it the run goes on and a warning at the
start says how to install it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from forge_core.api import hookimpl


class TensorBoardLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.writer = None

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print("warning: the tensorboard logger needs the tensorboard package "
                  "(pip install tensorboard); training goes on without it", file=sys.stderr, flush=True)
            return
        self.writer = SummaryWriter(log_dir=str(Path(run.out_dir) / self.options.log_dir),
                                    purge_step=run.start_step + 1 if run.start_step else None)

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.writer is None or not run.should_log(step):
            return
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"train/{key}", value, step)

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.writer is not None:
            self.writer.close()
            self.writer = None
