"""The ``csv`` logger writes one row per logged step, on the main process only."""

import csv

from forge_core.testing import run_context
from forge_plugin_example.csv_logger import CsvLogger
from forge_plugin_example.options import CsvOptions


def _run(tmp_path, rank=0):
    return run_context(tmp_path, total_steps=2, rank=rank)


def test_rows_per_step_with_header(tmp_path):
    logger, run = CsvLogger(CsvOptions()), _run(tmp_path)
    logger.forge_train_start(run)
    logger.forge_step_end(run, 1, {"loss": 2.5, "lr": 0.1})
    logger.forge_step_end(run, 2, {"loss": 2.0, "lr": 0.05})
    logger.forge_train_end(run, 2, "completed")
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert rows == [{"step": "1", "loss": "2.5", "lr": "0.1"}, {"step": "2", "loss": "2.0", "lr": "0.05"}]


def test_other_ranks_write_nothing(tmp_path):
    logger, run = CsvLogger(CsvOptions()), _run(tmp_path, rank=1)
    logger.forge_train_start(run)
    logger.forge_step_end(run, 1, {"loss": 1.0})
    logger.forge_train_end(run, 1, "completed")
    assert not (tmp_path / "metrics.csv").exists()
