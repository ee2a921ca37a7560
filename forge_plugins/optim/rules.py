"""Rules of the built-in optimizers: combinations of options that torch refuses when the
optimizer is built, said before anything is."""

from __future__ import annotations

from typing import Any

from forge_plugins.optim.options import SGDOptions

SGD_NESTEROV = "sgd.nesterov-momentum"


def check_sgd_nesterov(ctx: Any) -> str | None:
    options = ctx.config.train.optimizer_options
    if isinstance(options, SGDOptions) and options.nesterov and options.momentum <= 0:
        return f"nesterov is true with momentum {options.momentum}: Nesterov momentum needs a momentum above 0"
    return None


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=SGD_NESTEROV,
            severity="error",
            paths=("train.optimizer_options.nesterov", "train.optimizer_options.momentum"),
            summary="SGD's Nesterov momentum needs a momentum above 0.",
            check=check_sgd_nesterov,
            fix="Set train.optimizer_options.momentum above 0, or nesterov: false.",
        ),
    ]
