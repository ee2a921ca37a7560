"""The ``lm`` objective: the run's token cross-entropy (``train.loss``: full or chunked),
normalized by the labelled tokens. Forge's loss before objectives existed, unchanged."""

from __future__ import annotations

from typing import Any

import torch

from forge_core.api import IGNORE_INDEX, LABELS


class LanguageModeling:
    needs_reference = False

    def __init__(self, options: Any, token_loss: Any) -> None:
        self.token_loss = token_loss

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        """The tokens with a label."""
        return int((batch[LABELS] != IGNORE_INDEX).sum())

    def loss(
        self, output: torch.Tensor, batch: dict[str, torch.Tensor], reference: Any
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        loss_sum, tokens = self.token_loss(output, batch[LABELS])
        return loss_sum, tokens, {}
