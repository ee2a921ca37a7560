"""Registers the built-in loggers and their rule. Imports nothing heavy: it runs for
``forge-run check``."""

from __future__ import annotations

from forge_core.api import LoggerSpec, hookimpl
from forge_plugins.loggers.options import (
    ConsoleOptions,
    JsonlOptions,
    MlflowOptions,
    PlotOptions,
    ProfilerOptions,
    TensorBoardOptions,
    WandbOptions,
)


@hookimpl
def forge_loggers() -> list[LoggerSpec]:
    return [
        LoggerSpec(
            name="console",
            summary="tqdm progress bar: step, loss, learning rate, tokens/s",
            impl="forge_plugins.loggers.console:ConsoleLogger",
            options=ConsoleOptions,
        ),
        LoggerSpec(
            name="jsonl",
            summary="Metrics as JSON Lines in the run directory (metrics.jsonl)",
            impl="forge_plugins.loggers.jsonl:JsonlLogger",
            options=JsonlOptions,
        ),
        LoggerSpec(
            name="tensorboard",
            summary="TensorBoard scalars and the config as hyperparameters "
            "(extra: forge-trainer[tensorboard])",
            impl="forge_plugins.loggers.tensorboard:TensorBoardLogger",
            options=TensorBoardOptions,
        ),
        LoggerSpec(
            name="wandb",
            summary="Weights & Biases: config, metrics, loss-plot artifact; resumes the same "
            "run (extra: forge-trainer[wandb])",
            impl="forge_plugins.loggers.wandb:WandbLogger",
            options=WandbOptions,
        ),
        LoggerSpec(
            name="mlflow",
            summary="MLflow tracking: config as parameters, metrics, loss-plot artifact; "
            "resumes the same run (extra: forge-trainer[mlflow])",
            impl="forge_plugins.loggers.mlflow:MlflowLogger",
            options=MlflowOptions,
        ),
        LoggerSpec(
            name="plot",
            summary="Loss-curve PNG at the end of the run (when matplotlib is installed)",
            impl="forge_plugins.loggers.plot:PlotLogger",
            options=PlotOptions,
        ),
        LoggerSpec(
            name="profiler",
            summary="torch.profiler over a range of steps: Chrome trace (and CUDA memory "
            "snapshot) in the run directory",
            impl="forge_plugins.loggers.profiler:ProfilerLogger",
            options=ProfilerOptions,
        ),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.loggers.rules import rules

    return rules()
