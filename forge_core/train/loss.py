"""The training loss: token cross-entropy summed, normalised by the step's global count.

A step's loss is ``sum of per-token losses / number of tokens with a label`` over every
micro-batch and every data-parallel rank. Each micro-batch therefore contributes its
loss *sum* divided by the *global* count (known before the first backward), so gradient
accumulation and data parallelism give the gradient of one big batch, however unevenly
the ignored labels (-100) fall across micro-batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from forge_core.api.batch import IGNORE_INDEX


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of cross-entropy over tokens whose label is not -100, their count)``.
    The sum is computed in fp32 whatever the logits' dtype."""
    vocab = logits.shape[-1]
    loss_sum = F.cross_entropy(
        logits.reshape(-1, vocab).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss_sum, (labels != IGNORE_INDEX).sum()
