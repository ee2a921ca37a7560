"""Document isolation of a whole model, by equivalence: packed rows give every document
what it gets alone, forward and backward.

:func:`check_document_isolation` runs a built model on packed rows (``doc_ids`` and
``positions``) and raises ``AssertionError``, naming the dtype, the document and the
largest difference, unless:

- the packed logits of every document equal its logits when it is run alone;
- the gradient of one document's loss with respect to every parameter equals that of
  the document run alone (the backward pass sees no other document either);
- the gradient of that loss with respect to every embedding output (the output of each
  ``nn.Embedding`` the forward calls on the batch: the token embedding, a learned
  position embedding) is exactly zero on every other document's tokens, and equals that
  of the document alone on its own.

It runs in float64 first, where it is a proof: the model and its inputs are cast to
float64, and packed and standalone runs may differ only by float64 rounding (about
1e-14 of the size of what is compared), so a leak weighing 1e-10 of a row is caught.
Then, when asked, in float32, with the tolerance derived from the size of what is
compared (:mod:`forge_core.testing.tolerance`): the packed run goes through a masked
kernel and the standalone run through a causal one, which sum in different orders,
differently on every CPU. The gradient on other documents must be exactly 0 in every
dtype: a masked attention probability is ``exp(-inf) = 0``.

This adds what the attention-level check (:func:`~forge_core.testing.check_attention_backend`)
cannot see: positions restarting at every document, and a mask shared by every layer.

The default rows pack documents of several lengths, including single-token documents
and a last document that runs to the end of its row.

``standalone`` chooses how a document is run alone: ``"exact"`` runs it as a batch of
one row of its own length; ``"prefix"`` runs it at the start of rows of the packed
shape (the rest of its row after it, no ``doc_ids``), which by causality is the same
computation and lets shape-specialised compiled kernels (``flex``) reuse one compilation.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch

from forge_core.api import DOC_IDS, POSITIONS
from forge_core.testing.attention import packed_metadata, spans
from forge_core.testing.tolerance import (
    ROUNDING_FACTOR,
    assert_exactly_zero,
    assert_within_rounding,
    dtype_name,
    longest_sum,
)

#: Two rows of 24 tokens: single-token documents, and documents ending the row.
DEFAULT_ROWS: tuple[tuple[int, ...], ...] = ((5, 1, 11, 7), (1, 16, 7))


def _alone(input_ids, b, start, end, standalone):
    """Document ``start:end`` of row ``b`` of ``input_ids`` to run by itself (see the
    module docstring)."""
    row = input_ids[b : b + 1]
    if standalone == "exact":
        return row[:, start:end]
    if standalone != "prefix":
        raise ValueError(f"standalone must be 'exact' or 'prefix', got {standalone!r}")
    return torch.roll(row, -start, dims=1).expand_as(input_ids).contiguous()


def _gradients(model, input_ids, doc_ids, positions, loss_fn):
    """Forward and backward: ``(logits, embedding-output gradients, parameter gradients)``,
    every ``nn.Embedding`` output over the batch made a leaf."""
    leaves: list[torch.Tensor] = []
    batch_shape = tuple(input_ids.shape[:2])

    def as_leaf(module, inputs, output):
        if not (
            isinstance(output, torch.Tensor)
            and output.is_floating_point()
            and tuple(output.shape[:2]) == batch_shape
        ):
            return None
        leaf = output.detach().requires_grad_(True)
        leaves.append(leaf)
        return leaf

    handles = [m.register_forward_hook(as_leaf) for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    try:
        metadata = {} if doc_ids is None else {DOC_IDS: doc_ids, POSITIONS: positions}
        logits = model(input_ids, **metadata)
    finally:
        for handle in handles:
            handle.remove()
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss_fn(logits), leaves + [p for _, p in params], allow_unused=True)
    return (
        logits.detach(),
        grads[: len(leaves)],
        dict(zip((name for name, _ in params), grads[len(leaves) :])),
    )


def check_document_isolation(
    model: torch.nn.Module,
    *,
    rows: Sequence[Sequence[int]] = DEFAULT_ROWS,
    seed: int = 0,
    standalone: str = "exact",
    device: torch.device | str = "cpu",
    dtypes: Iterable[torch.dtype] = (torch.float64, torch.float32),
    rounding_factor: float = ROUNDING_FACTOR,
) -> dict[torch.dtype, float]:
    """``model`` (``forward(input_ids, doc_ids=, positions=)`` returning logits ``(B, S,
    vocab)``) on packed rows gives every document the logits and gradients it gets alone,
    in each of ``dtypes`` (a copy of the model and its inputs are cast). Returns, per
    dtype, the largest ratio of a difference to its tolerance (below 1: how close the
    check came to failing)."""
    doc_ids, positions = packed_metadata(rows, device)
    gen = torch.Generator().manual_seed(seed)
    vocab = _vocab_size(model, doc_ids.shape[1], device)
    input_ids = torch.randint(0, vocab, doc_ids.shape, generator=gen).to(device)
    # The loss: a fixed random projection of one document's logits (row 0's longest
    # document after its first, so it has predecessors it must not see).
    start, end = max(spans(rows[0])[1:], key=lambda s: s[1] - s[0])
    weights = torch.randn((end - start, vocab), generator=gen, dtype=torch.float64)
    terms = longest_sum(model, doc_ids.shape[1])
    worst = {}
    for dtype in dtypes:
        cast = copy.deepcopy(model).to(device=device, dtype=dtype)
        worst[dtype] = _check_in(
            cast,
            input_ids,
            doc_ids,
            positions,
            rows,
            (start, end),
            weights.to(device, dtype),
            standalone,
            dtype,
            terms,
            rounding_factor,
        )
    return worst


def _vocab_size(model, seq_len, device):
    with torch.no_grad():
        out = model(torch.zeros(1, seq_len, dtype=torch.long, device=device))
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != (1, seq_len):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise AssertionError(
            f"forward(input_ids (1, {seq_len})) must return logits (1, {seq_len}, vocab), got {shape}"
        )
    return out.shape[-1]


def _check_in(
    model, input_ids, doc_ids, positions, rows, loss_span, weights, standalone, dtype, terms, factor
):
    name = dtype_name(dtype)
    start, end = loss_span

    def close(got, want, what, dims=None):
        return assert_within_rounding(
            got, want, dtype=dtype, terms=terms, what=f"{name}: {what}", dims=dims, factor=factor
        )

    logits, embedded, params = _gradients(
        model, input_ids, doc_ids, positions, lambda out: (out[0, start:end] * weights).sum()
    )
    ratios = []
    for row, lengths in enumerate(rows):
        for d, (s, e) in enumerate(spans(lengths)):
            with torch.no_grad():
                alone = model(_alone(input_ids, row, s, e, standalone))[:1, : e - s]
            ratios.append(
                close(
                    logits[row, s:e],
                    alone[0],
                    f"row {row} document {d} (tokens {s}:{e}): packed logits differ from the document "
                    "run alone",
                    ("token within the document", "vocab"),
                )
            )
    if not embedded:
        raise AssertionError(
            f"{name}: no nn.Embedding output of the batch's shape {tuple(input_ids.shape[:2])} was seen, so "
            "the check that a document's gradient is exactly 0 on other documents' tokens cannot run: "
            "embed the tokens with a torch.nn.Embedding module"
        )
    # Exactly zero, whatever the dtype: a masked attention probability is exp(-inf) = 0.
    for n, grad in enumerate(embedded):
        outside = grad.clone()
        outside[0, start:end] = 0
        assert_exactly_zero(
            outside,
            f"{name}: the loss of document {start}:{end} has gradient on other documents' tokens "
            f"(embedding output {n})",
            ("row", "token", "dim"),
        )
    _, embedded_alone, params_alone = _gradients(
        model,
        _alone(input_ids, 0, start, end, standalone),
        None,
        None,
        lambda out: (out[0, : end - start] * weights).sum(),
    )
    if len(embedded_alone) != len(embedded):
        raise AssertionError(
            f"{name}: the packed forward passed {len(embedded)} embedding output(s), the document alone "
            f"{len(embedded_alone)}: the model must embed the same way whatever the metadata"
        )
    for n, (grad, want) in enumerate(zip(embedded, embedded_alone)):
        ratios.append(
            close(
                grad[0, start:end],
                want[0, : end - start],
                f"gradient of document {start}:{end} with respect to embedding output {n} differs from "
                "the document alone",
                ("token within the document", "dim"),
            )
        )
    for pname, grad in params.items():
        want = params_alone[pname]
        if grad is None or want is None:
            if (grad is None) != (want is None):
                raise AssertionError(
                    f"{name}: parameter {pname} gets a gradient in only one of the packed and standalone runs"
                )
            continue
        ratios.append(
            close(
                grad,
                want,
                f"gradient of document {start}:{end}'s loss with respect to {pname} differs from the "
                "document alone (the backward pass sees other documents)",
            )
        )
    return max(ratios)
