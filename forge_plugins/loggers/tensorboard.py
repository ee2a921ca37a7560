"""The ``tensorboard`` logger: every metric as a scalar under ``<run>/tensorboard``, and
the resolved config as hyperparameters (the HParams tab: the config the run started
with, as TensorBoard keeps a run's first) and as text at every start (``config``, at
the step the run started or resumed from, so a setting changed on resume shows).

Metric names follow :mod:`forge_plugins.loggers.tracking` (``train/loss``,
``eval/loss``). A resumed run writes into the same directory and drops what an earlier
attempt logged after the checkpoint it resumed from (``purge_step``).

Needs the ``tensorboard`` package (``pip install 'forge-trainer[tensorboard]'``);
without it the run goes on and a warning at the start says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from forge_core.api import hookimpl
from forge_plugins.loggers.tracking import flat_config, missing, numeric_metrics, plain_config


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
            from torch.utils.tensorboard.summary import hparams
        except ImportError:
            missing("tensorboard")
            return
        log_dir = Path(run.out_dir) / self.options.log_dir
        started = any(log_dir.glob("events.out.tfevents.*"))
        self.writer = SummaryWriter(
            log_dir=str(log_dir), purge_step=run.start_step + 1 if run.start_step else None
        )
        if not started:
            # TensorBoard keeps a run's first hyperparameters only: write them once. The
            # HParams tab pairs them with the run's scalars, showing the metric named.
            for summary in hparams(flat_config(run.config), {"train/loss": 0.0}):
                self.writer.file_writer.add_summary(summary, run.start_step)
        text = yaml.safe_dump(plain_config(run.config), sort_keys=False)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), run.start_step)

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.writer is None or not run.should_log(step):
            return
        for name, value in numeric_metrics(metrics).items():
            self.writer.add_scalar(name, value, step)

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.writer is not None:
            self.writer.close()
            self.writer = None
