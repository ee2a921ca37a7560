"""The training loss: token cross-entropy summed, normalised by the step's global count.

A step's loss is ``sum of per-token losses / number of tokens with a label`` over every
micro-batch and every data-parallel rank; its gradient follows the gradient convention
(docs/plugin-guide/parallelism.md#the-gradient-convention).

Every loss has the signature ``loss(output, labels) -> (loss_sum, token_count)``, and
:func:`build_loss` picks the one ``train.loss`` names: :func:`loss_fn` over the logits
the model returns (``full``), or :class:`~forge_core.train.chunked_loss.ChunkedLoss`
over the hidden states a model returns once the loss has taken over its output head
(``chunked``). The trainer, :meth:`~forge_core.distributed.parallelize.ParallelModel.evaluate`
and the last pipeline stage call whichever was built, through ``ParallelModel.loss_fn``.
The choice is a ``train`` setting, not a model option: the loss is the trainer's, the
same for every model; a model only declares where its output head is
(``ParallelContract.output_head``), and a rule refuses ``chunked`` for one that does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from forge_core.api.batch import IGNORE_INDEX

LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of cross-entropy over tokens whose label is not -100, their count)``.
    The sum is computed in at least fp32 whatever the logits' dtype (float64 stays
    float64)."""
    vocab = logits.shape[-1]
    dtype = torch.promote_types(logits.dtype, torch.float32)
    loss_sum = F.cross_entropy(
        logits.reshape(-1, vocab).to(dtype), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss_sum, (labels != IGNORE_INDEX).sum()


def build_loss(model: torch.nn.Module, config: Any) -> LossFn:
    """The loss ``config.train.loss`` names, for ``model`` as built (before any
    parallelism is applied: the chunked loss takes over the model's output head, which
    every strategy then keeps where it is)."""
    loss = config.train.loss
    if loss.name == "full":
        return loss_fn
    from forge_core.train.chunked_loss import ChunkedLoss, take_over_head

    return ChunkedLoss(take_over_head(model, config.model.name), loss.chunk_tokens)
