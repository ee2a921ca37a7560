"""Document isolation of a whole model, by equivalence: a check any backend can run.

:func:`check_document_isolation` runs a model on packed rows (``doc_ids`` and rotary
``positions``) and raises ``AssertionError``, naming the document and the largest
difference, unless packed logits equal the logits of every document run alone, and the
gradient of one document's loss with respect to the embedding output is exactly zero on
every other document's tokens and that of the document alone on its own.

It runs in float64 first, where it is a proof: the model and its inputs are cast to
float64, and packed and standalone runs may differ only by float64 rounding (about
1e-14 of the size of what is compared), so a leak weighing 1e-10 of a row is caught.
Then in float32, the dtype models train in, with the tolerance derived from the size of
what is compared (:mod:`forge_core.testing.tolerance`): the packed run goes through a
masked kernel and the standalone run through a causal one, which sum in different
orders, differently on every CPU. The gradient on other documents must be exactly 0 in
every dtype.

Attention-level checks (agreement with the reference, isolation at the q/k/v level) are
the conformance kit's: :func:`forge_core.testing.check_attention_backend`. This check
adds what the kit cannot see: rotary positions restarting at every document, and masks
shared by every layer of a real model.

The default rows pack documents of several lengths, including single-token documents
and a last document that runs to the end of its row.

``standalone`` chooses how a document is run alone: ``"exact"`` runs it as a batch of
one row of its own length; ``"prefix"`` runs it at the start of rows of the packed
shape (the rest of its row after it, no ``doc_ids``), which by causality is the same
computation and lets shape-specialised compiled kernels (``flex``) reuse one compilation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from forge_core.testing.tolerance import (
    ROUNDING_FACTOR,
    assert_exactly_zero,
    assert_within_rounding,
    dtype_name,
    longest_sum,
)
from forge_plugins.attention.reference import packed_metadata, spans

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


def tiny_llama(backend: Any, vocab_size: int = 61) -> Any:
    """A small fp32 llama using ``backend``; a large init makes any leak visible."""
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    options = LlamaOptions(
        dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=128, init_std=0.3
    )
    torch.manual_seed(0)
    return build(options, vocab_size=vocab_size, attention=backend)


def _embedding_grads(model, input_ids, doc_ids, positions, loss_fn):
    """Forward and backward with the embedding output as the leaf; returns (logits, grad)."""
    captured = []

    def as_leaf(module, inputs, output):
        leaf = output.detach().requires_grad_(True)
        captured.append(leaf)
        return leaf

    handle = model.tok_embeddings.register_forward_hook(as_leaf)
    try:
        logits = model(input_ids, doc_ids=doc_ids, positions=positions)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(loss_fn(logits), captured)
    return logits.detach(), grad


def check_document_isolation(
    backend: Any,
    *,
    build_model: Callable[[Any], Any] = tiny_llama,
    rows: Sequence[Sequence[int]] = DEFAULT_ROWS,
    seed: int = 0,
    standalone: str = "exact",
    device: torch.device | str = "cpu",
    dtypes: Iterable[torch.dtype] = (torch.float64, torch.float32),
    rounding_factor: float = ROUNDING_FACTOR,
) -> dict[torch.dtype, float]:
    """A model on packed rows (``doc_ids``, ``positions``) gives every document the logits
    and input gradients it gets alone, in each of ``dtypes`` (the model and its inputs
    are cast). ``build_model(backend)`` returns a model with a ``tok_embeddings`` module
    and ``forward(input_ids, doc_ids=, positions=)``. Returns, per dtype, the largest
    ratio of a difference to its tolerance (below 1: how close the check came to
    failing)."""
    built = build_model(backend)
    doc_ids, positions = packed_metadata(rows, device)
    gen = torch.Generator().manual_seed(seed)
    vocab = built.tok_embeddings.num_embeddings
    input_ids = torch.randint(0, vocab, doc_ids.shape, generator=gen).to(device)
    # The loss: a fixed random projection of one document's logits (row 0's longest
    # document after its first, so it has predecessors it must not see).
    start, end = max(spans(rows[0])[1:], key=lambda s: s[1] - s[0])
    weights = torch.randn((end - start, vocab), generator=gen, dtype=torch.float64)
    terms = longest_sum(built, doc_ids.shape[1])
    worst = {}
    for dtype in dtypes:
        model = copy.deepcopy(built).to(device=device, dtype=dtype)
        worst[dtype] = _check_in(
            model, input_ids, doc_ids, positions, rows, (start, end), weights.to(device, dtype),
            standalone, dtype, terms, rounding_factor,
        )
    return worst


def _check_in(model, input_ids, doc_ids, positions, rows, loss_span, weights, standalone, dtype, terms, factor):
    name = dtype_name(dtype)
    start, end = loss_span

    def close(got, want, what, dims):
        return assert_within_rounding(got, want, dtype=dtype, terms=terms, what=f"{name}: {what}", dims=dims, factor=factor)

    logits, grad = _embedding_grads(
        model, input_ids, doc_ids, positions, lambda out: (out[0, start:end] * weights).sum()
    )
    ratios = []
    for row, lengths in enumerate(rows):
        for d, (s, e) in enumerate(spans(lengths)):
            with torch.no_grad():
                alone = model(_alone(input_ids, row, s, e, standalone))[:1, : e - s]
            ratios.append(close(
                logits[row, s:e], alone[0],
                f"row {row} document {d} (tokens {s}:{e}): packed logits differ from the document run alone",
                ("token within the document", "vocab"),
            ))
    # Exactly zero, whatever the dtype: a masked attention probability is exp(-inf) = 0.
    outside = grad.clone()
    outside[0, start:end] = 0
    assert_exactly_zero(
        outside, f"{name}: the loss of document {start}:{end} has gradient on other documents' tokens",
        ("row", "token", "dim"),
    )
    _, alone_grad = _embedding_grads(
        model, _alone(input_ids, 0, start, end, standalone), None, None,
        lambda out: (out[0, : end - start] * weights).sum(),
    )
    ratios.append(close(
        grad[0, start:end], alone_grad[0, : end - start],
        f"embedding gradient of document {start}:{end} differs from the document alone",
        ("token within the document", "dim"),
    ))
    return max(ratios)
