"""The ``dpo`` objective: preference training on chosen/rejected pairs (DPO, IPO, and
reference-free), normalized by the pairs.

The data (preference pairs, docs/fine-tuning.md) puts each pair in one row as two
documents, the chosen completion first: inside a row, document ``2k`` (its ``doc_ids``)
is pair ``k``'s chosen completion and ``2k + 1`` its rejected one, the prompt tokens
unlabelled (-100) and the completion's labelled. Documents are isolated by attention and
their positions restart, so each document's log-probabilities do not depend on what it
is packed with, and several pairs share a row.

A document's sequence log-probability is the sum of ``log p(label)`` over its labelled
tokens. With ``pi`` the policy's and ``ref`` the reference's, ``margin = (pi_c - ref_c)
- (pi_r - ref_r)`` and the loss of a pair is ``-log sigmoid(beta * margin)`` (DPO,
Rafailov et al. 2023) or ``(margin - 1 / (2 beta))^2`` (IPO, Azar et al. 2023); without
a reference (``reference: none``) ``ref`` is 0. The rewards are ``beta * (pi - ref)``.

Ties are ties. The margin subtracts sums of per-token log-probabilities, each itself a
difference ``logit - logsumexp``; two completions that score the same in exact arithmetic
come out a few roundings apart, and by how much depends on the CPU's kernels (where a
row sits in a blocked matmul, the order of a sum). So the metrics compare within the
rounding of what was subtracted (:func:`tie_tolerance`): a pair whose
``|margin| <= TIE_ULPS * eps * scale`` is a tie, where ``eps`` is the spacing at 1 of the
dtype the log-probabilities are summed in (at least fp32) and ``scale`` the sum, over the
labelled tokens of the pair's completions under the policy and the reference, of
``|logit of the label| + |logsumexp|``. A tie is not won (``dpo/reward_accuracy`` counts
pairs whose margin is above the tolerance) and its ``dpo/reward_margin`` is 0. The loss
takes the margin as computed: it is continuous in it, so rounding moves it by rounding
and decides nothing. (With bf16 logits the logits' own rounding is coarser than the
tolerance: it is that of the sums, not of a bf16 forward.)

Padding and the filler rows of an evaluation have no labelled token, so they hold no
pair. A pair whose chosen completion has labelled tokens and whose rejected one has none
(or the reverse) is refused when the step counts its pairs: the data is not pairs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from forge_core.api import DOC_IDS, IGNORE_INDEX, LABELS, ForgeError
from forge_plugins.objectives.options import DPO_METRICS

ACCURACY, CHOSEN, REJECTED, MARGIN = DPO_METRICS

#: Roundings of the size of the subtracted terms within which two completions tie: the
#: suite's rounding factor (forge_core.testing.tolerance), which covers the chain of
#: roundings of a forward measured across CPU kernels and thread counts.
TIE_ULPS = 16.0


def _slots(seq_len: int) -> int:
    """Document slots per row: a row of ``seq_len`` tokens holds at most ``seq_len``
    documents; rounded up to whole pairs."""
    return seq_len + seq_len % 2


def _doc_ids(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    doc_ids = batch.get(DOC_IDS)
    if doc_ids is None:
        raise ForgeError(
            "train.objective: dpo reads the pairs from the rows' doc_ids, but this batch has none: use "
            "a packer that emits doc_ids (data.packer: bfd) with preference-pair data."
        )
    return doc_ids


def labelled_documents(labels: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """``(rows, pairs, 2)`` booleans: whether each document has a labelled token."""
    rows, seq = labels.shape
    labelled = (labels != IGNORE_INDEX).to(torch.int32)
    has = labelled.new_zeros(rows, _slots(seq)).scatter_add_(1, doc_ids, labelled)
    return (has > 0).view(rows, -1, 2)


def sequence_logps(
    logits: torch.Tensor, labels: torch.Tensor, doc_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logps, has, scale)``, each ``(rows, pairs, 2)``: each document's summed
    log-probability of its labelled tokens (in at least fp32), whether it has any, and
    the size of what was subtracted to get it (``|logit of the label| + |logsumexp|``
    summed over those tokens, without gradient: :func:`tie_tolerance`)."""
    rows, seq, vocab = logits.shape
    dtype = torch.promote_types(logits.dtype, torch.float32)
    flat = logits.reshape(-1, vocab).to(dtype)
    target = labels.reshape(-1)
    token = -F.cross_entropy(flat, target, ignore_index=IGNORE_INDEX, reduction="none")  # 0 at -100
    with torch.no_grad():
        labelled = target != IGNORE_INDEX
        logit = flat.gather(1, torch.where(labelled, target, 0)[:, None])[:, 0]
        # logsumexp = logit - log p: no second pass over the vocabulary.
        size = torch.where(labelled, logit.abs() + (logit - token).abs(), 0.0)
    logps = token.new_zeros(rows, _slots(seq)).scatter_add_(1, doc_ids, token.view(rows, seq))
    scale = size.new_zeros(rows, _slots(seq)).scatter_add_(1, doc_ids, size.view(rows, seq))
    return logps.view(rows, -1, 2), labelled_documents(labels, doc_ids), scale.view(rows, -1, 2)


def tie_tolerance(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per pair, the largest ``|margin|`` that rounding alone can make of two
    completions that score the same: ``TIE_ULPS * eps(dtype) * scale`` summed over a
    pair's two completions (``scale``: ``(..., 2)``, the policy's plus the reference's
    from :func:`sequence_logps`; module docstring)."""
    return TIE_ULPS * torch.finfo(dtype).eps * scale.sum(-1)


class DirectPreference:
    """The ``dpo`` objective (module docstring); ``options`` are
    :class:`~forge_plugins.objectives.options.DpoOptions`."""

    def __init__(self, options: Any, token_loss: Any) -> None:
        self.options = options
        self.needs_reference = options.reference == "model"

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        """The pairs in ``batch``; a ForgeError naming the row when a document of a pair
        has labelled tokens and its partner none."""
        has = labelled_documents(batch[LABELS], _doc_ids(batch))
        broken = has[..., 0] != has[..., 1]
        if bool(broken.any()):
            row, pair = (int(i) for i in broken.nonzero()[0])
            side = "chosen" if bool(has[row, pair, 0]) else "rejected"
            raise ForgeError(
                f"train.objective: dpo: row {row} of a batch holds document {2 * pair} and {2 * pair + 1} "
                f"as pair {pair}, but only the {side} one has labelled tokens. Each row must hold whole "
                "preference pairs, the chosen completion then the rejected one (preference-pair data with "
                "data.packer: bfd); a completion that is cut away entirely leaves half a pair."
            )
        return int(has[..., 0].sum())

    def loss(
        self, output: torch.Tensor, batch: dict[str, torch.Tensor], reference: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        labels, doc_ids = batch[LABELS], _doc_ids(batch)
        policy, has, scale = sequence_logps(output, labels, doc_ids)
        ratio = policy
        if reference is not None:
            ref, _, ref_scale = sequence_logps(reference, labels, doc_ids)
            ratio, scale = policy - ref, scale + ref_scale
        pairs = has[..., 0] & has[..., 1]
        beta = self.options.beta
        margin = ratio[..., 0] - ratio[..., 1]
        # Rounding cannot decide a pair: within the tolerance the completions tie.
        tie = margin.detach().abs() <= tie_tolerance(scale, policy.dtype)
        won = ~tie & (margin.detach() > 0)
        if self.options.loss == "ipo":
            losses = (margin - 1 / (2 * beta)) ** 2
        else:
            losses = -F.logsigmoid(beta * margin)
        zero = losses.new_zeros(())
        rewards = (beta * ratio).detach()

        def total(x: torch.Tensor) -> torch.Tensor:
            return torch.where(pairs, x, zero).sum()

        sums = {
            ACCURACY: (pairs & won).sum(),
            CHOSEN: total(rewards[..., 0]),
            REJECTED: total(rewards[..., 1]),
            MARGIN: total(torch.where(tie, zero, beta * margin.detach())),
        }
        return total(losses), pairs.sum(), sums
