"""The component builder: each component of a judged plan, constructed through the
registries only (:mod:`forge_core.components.build`), and the names of the component
that failed (:mod:`forge_core.components.blame`). Used by the trainer, the data path and
the commands alike."""

from forge_core.components.blame import built_culprit, culprit, describe, failure, original_error
from forge_core.components.build import (
    attention,
    chosen_source,
    loggers,
    model,
    objective,
    optimizer,
    packer,
    saved_tokenizer,
    schedule,
    source,
    tokenizer,
    without_pretrained,
)

__all__ = [
    "attention",
    "built_culprit",
    "chosen_source",
    "culprit",
    "describe",
    "failure",
    "loggers",
    "model",
    "objective",
    "optimizer",
    "original_error",
    "packer",
    "saved_tokenizer",
    "schedule",
    "source",
    "tokenizer",
    "without_pretrained",
]
