"""The component builder: each component of a judged plan, constructed through the
registries only (:mod:`forge_core.components.build`), and the names of the component
that failed (:mod:`forge_core.components.blame`). Used by the trainer, the data path and
the commands alike."""

from forge_core.components.blame import built_culprit, culprit, describe, failure, original_error
from forge_core.components.build import (
    attention,
    base_from_seed,
    chosen_source,
    loggers,
    model,
    objective,
    optimizer,
    packer,
    pretrained_path,
    pretrained_source,
    saved_tokenizer,
    saves_trainable_only,
    schedule,
    source,
    tokenizer,
    without_pretrained,
)

__all__ = [
    "attention",
    "base_from_seed",
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
    "pretrained_path",
    "pretrained_source",
    "saved_tokenizer",
    "saves_trainable_only",
    "schedule",
    "source",
    "tokenizer",
    "without_pretrained",
]
