"""Numerical conformance checks for attention backends, reusable by any backend.

Each check takes a constructed backend (``prepare``/``attend``), runs it on random fp32
inputs and raises ``AssertionError`` naming the case and the largest difference when it
misbehaves:

- :func:`check_agrees_with_eager`: outputs and q/k/v gradients equal the eager
  reference, with and without ``doc_ids``.
- :func:`check_attention_isolation`: at the attention level, every packed document's
  outputs equal those of the document attended alone, and gradients of one document's
  outputs reach only that document's q/k/v.
- :func:`check_document_isolation`: the same through a whole model with rotary
  ``positions``: packed logits equal standalone logits, and gradients with respect to the
  embedding output of one document's loss are those of the document alone and zero
  everywhere else.

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

from forge_plugins.attention.eager import EagerAttention
from forge_plugins.attention.reference import packed_metadata, spans

#: Two rows of 24 tokens: single-token documents, and documents ending the row.
DEFAULT_ROWS: tuple[tuple[int, ...], ...] = ((5, 1, 11, 7), (1, 16, 7))


def _assert_close(actual, expected, what: str, atol: float, rtol: float) -> None:
    try:
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
    except AssertionError as exc:
        diff = (actual - expected).abs().max().item()
        raise AssertionError(f"{what}: max abs difference {diff:.3g}\n{exc}") from None


def _qkv(batch, seq_len, heads, kv_heads, head_dim, seed, device):
    """Random q, k, v ``(B, H, S, D)`` laid out as a model produces them: views of
    ``(B, S, H, D)`` projections, transposed."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, seq_len, heads, head_dim)] + [(batch, seq_len, kv_heads, head_dim)] * 2
    return [
        torch.randn(s, generator=gen).to(device).transpose(1, 2).requires_grad_(True)
        for s in shapes
    ]


def _alone(tensor, b, start, end, seq_dim, standalone, batch):
    """Document ``start:end`` of row ``b`` to run by itself (see the module docstring)."""
    row = tensor.narrow(0, b, 1)
    if standalone == "exact":
        return row.narrow(seq_dim, start, end - start)
    if standalone != "prefix":
        raise ValueError(f"standalone must be 'exact' or 'prefix', got {standalone!r}")
    rolled = torch.roll(row, -start, dims=seq_dim)
    # Same shape and memory layout as the packed input (empty_like keeps the strides).
    out = torch.empty_like(tensor, requires_grad=False)
    return out.copy_(rolled.expand_as(tensor))


def _attend_with_grads(backend, q, k, v, doc_ids, cotangent):
    out = backend.attend(q, k, v, backend.prepare(doc_ids, q.shape[2], q.device))
    grads = torch.autograd.grad((out * cotangent).sum(), (q, k, v))
    return out.detach(), grads


def check_agrees_with_eager(
    backend: Any,
    *,
    rows: Sequence[Sequence[int]] = DEFAULT_ROWS,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 8,
    seed: int = 0,
    device: torch.device | str = "cpu",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """``backend`` matches eager attention, forward and backward, with and without doc_ids."""
    doc_ids, _ = packed_metadata(rows, device)
    batch, seq_len = doc_ids.shape
    reference = EagerAttention(None)
    for case, ids in (("causal (doc_ids=None)", None), ("packed (doc_ids)", doc_ids)):
        q, k, v = _qkv(batch, seq_len, heads, kv_heads, head_dim, seed, device)
        gen = torch.Generator().manual_seed(seed + 1)
        cotangent = torch.randn(q.shape, generator=gen).to(device)
        out, grads = _attend_with_grads(backend, q, k, v, ids, cotangent)
        ref_out, ref_grads = _attend_with_grads(reference, q, k, v, ids, cotangent)
        _assert_close(out, ref_out, f"{case}: output differs from eager", atol, rtol)
        for name, grad, ref in zip("qkv", grads, ref_grads):
            _assert_close(grad, ref, f"{case}: grad of {name} differs from eager", atol, rtol)


def check_attention_isolation(
    backend: Any,
    *,
    rows: Sequence[Sequence[int]] = DEFAULT_ROWS,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 8,
    seed: int = 0,
    standalone: str = "exact",
    device: torch.device | str = "cpu",
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Packed attention equals per-document attention, outputs and gradients."""
    doc_ids, _ = packed_metadata(rows, device)
    batch, seq_len = doc_ids.shape
    q, k, v = _qkv(batch, seq_len, heads, kv_heads, head_dim, seed, device)
    packed = backend.attend(q, k, v, backend.prepare(doc_ids, seq_len, device))

    def attend_alone(b, start, end, tensors):
        part = [_alone(t, b, start, end, 2, standalone, batch) for t in tensors]
        out = backend.attend(*part, backend.prepare(None, part[0].shape[2], device))
        return out[:1, :, : end - start], part

    for b, lengths in enumerate(rows):
        for d, (start, end) in enumerate(spans(lengths)):
            alone, _ = attend_alone(b, start, end, (q.detach(), k.detach(), v.detach()))
            _assert_close(
                packed[b : b + 1, :, start:end].detach(), alone,
                f"row {b} document {d} (tokens {start}:{end}): packed output differs from "
                "the document attended alone", atol, rtol,
            )
    # Gradients of the longest document of row 0 that is not its first.
    b = 0
    start, end = max(spans(rows[0])[1:], key=lambda s: s[1] - s[0])
    grads = torch.autograd.grad(packed[b, :, start:end].sum(), (q, k, v))
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    alone, part = attend_alone(b, start, end, leaves)
    alone_grads = torch.autograd.grad(alone.sum(), leaves)
    for name, grad, leaf_grad in zip("qkv", grads, alone_grads):
        # Map the standalone gradient back onto the document's tokens of row b.
        ref = leaf_grad[b : b + 1, :, start:end]
        _assert_close(
            grad[b : b + 1, :, start:end], ref,
            f"grad of {name} inside document {start}:{end} differs from the document alone",
            atol, rtol,
        )
        outside = grad.clone()
        outside[b, :, start:end] = 0
        _assert_close(
            outside, torch.zeros_like(outside),
            f"grad of {name} leaks outside document {start}:{end}", atol, rtol,
        )


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
    batch = doc_ids.shape[0]
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
                alone = model(_alone(input_ids, row, s, e, 1, standalone, batch))[:1, : e - s]
            _assert_close(
                logits[row : row + 1, s:e], alone,
                f"row {row} document {d} (tokens {s}:{e}): packed logits differ from the "
                "document run alone", atol, rtol,
            )
    _, alone_grad = _embedding_grads(
        model, _alone(input_ids, b, start, end, 1, standalone, batch), None, None,
        lambda out: (out[0, : end - start] * weights).sum(),
    )
    _assert_close(
        grad[b : b + 1, start:end], alone_grad[:1, : end - start],
        f"embedding gradient of document {start}:{end} differs from the document alone",
        atol, rtol,
    )
    outside = grad.clone()
    outside[b, start:end] = 0
    _assert_close(
        outside, torch.zeros_like(outside),
        f"the loss of document {start}:{end} has gradient on other documents' tokens",
        atol, rtol,
    )
