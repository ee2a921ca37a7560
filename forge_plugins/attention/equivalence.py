"""Document isolation of a whole model, by equivalence: a check any backend can run.

:func:`check_document_isolation` runs a model on packed rows (``doc_ids`` and rotary
``positions``) and raises ``AssertionError``, naming the document and the largest
difference, unless packed logits equal the logits of every document run alone, and the
gradient of one document's loss with respect to the embedding output is that of the
document alone and zero on every other document's tokens.

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

from collections.abc import Callable, Sequence
from typing import Any

import torch

from forge_core.testing.attention import assert_close
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
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """A model on packed rows (``doc_ids``, ``positions``) gives every document the logits
    and input gradients it gets alone. ``build_model(backend)`` returns a model with a
    ``tok_embeddings`` module and ``forward(input_ids, doc_ids=, positions=)``."""
    model = build_model(backend).to(device)
    doc_ids, positions = packed_metadata(rows, device)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.tok_embeddings.num_embeddings
    input_ids = torch.randint(0, vocab, doc_ids.shape, generator=gen).to(device)
    # The loss: a fixed random projection of one document's logits (row 0's longest
    # document after its first, so it has predecessors it must not see).
    b = 0
    start, end = max(spans(rows[0])[1:], key=lambda s: s[1] - s[0])
    weights = torch.randn((end - start, vocab), generator=gen).to(device)

    logits, grad = _embedding_grads(
        model, input_ids, doc_ids, positions,
        lambda out: (out[b, start:end] * weights).sum(),
    )
    for row, lengths in enumerate(rows):
        for d, (s, e) in enumerate(spans(lengths)):
            with torch.no_grad():
                alone = model(_alone(input_ids, row, s, e, standalone))[:1, : e - s]
            assert_close(
                logits[row, s:e], alone[0], atol, rtol,
                f"row {row} document {d} (tokens {s}:{e}): packed logits differ from the "
                "document run alone", dims=("token within the document", "vocab"),
            )
    _, alone_grad = _embedding_grads(
        model, _alone(input_ids, b, start, end, standalone), None, None,
        lambda out: (out[0, : end - start] * weights).sum(),
    )
    assert_close(
        grad[b, start:end], alone_grad[0, : end - start], atol, rtol,
        f"embedding gradient of document {start}:{end} differs from the document alone",
        dims=("token within the document", "dim"),
    )
    outside = grad.clone()
    outside[b, start:end] = 0
    assert_close(
        outside, torch.zeros_like(outside), atol, rtol,
        f"the loss of document {start}:{end} has gradient on other documents' tokens",
        dims=("row", "token", "dim"),
    )
