"""Registers the built-in loggers and their rule. Imports nothing heavy: it runs for
``forge-run check``."""

from __future__ import annotations

from forge_core.api import LoggerSpec, hookimpl

from forge_plugins.loggers.options import ConsoleOptions, JsonlOptions, PlotOptions, TensorBoardOptions


@hookimpl
def forge_loggers() -> list[LoggerSpec]:
    return [
        LoggerSpec(name="console", summary="tqdm progress bar: step, loss, learning rate, tokens/s",
                   impl="forge_plugins.loggers.console:ConsoleLogger", options=ConsoleOptions),
        LoggerSpec(name="jsonl", summary="Metrics as JSON Lines in the run directory (metrics.jsonl)",
                   impl="forge_plugins.loggers.jsonl:JsonlLogger", options=JsonlOptions),
        LoggerSpec(name="tensorboard", summary="TensorBoard scalars (when tensorboard is installed)",
                   impl="forge_plugins.loggers.tensorboard:TensorBoardLogger", options=TensorBoardOptions),
        LoggerSpec(name="plot", summary="Loss-curve PNG at the end of the run (when matplotlib is installed)",
                   impl="forge_plugins.loggers.plot:PlotLogger", options=PlotOptions),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.loggers.rules import rules

    return rules()
