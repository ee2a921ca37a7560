"""Training FLOPs of a step, for model FLOPs utilisation (MFU).

A step costs ``6 * N`` FLOPs per input token for the parameter matmuls (``N`` excludes
embedding tables, whose lookup is not a matmul; a tied output head is a matmul and
counts; ``N`` counts the parameters a token is computed with, so a module of which each
token uses only a share, a mixture-of-experts layer's routed experts, declares it:
:func:`active_matmul_params`) plus the attention score and value products. Attention
is counted for the pairs actually attended: under causal attention with document masking a token attends
only to the earlier tokens of its own document, so a row costs ``sum_d L_d (L_d + 1) / 2``
pairs instead of ``S (S + 1) / 2``. Which pairs are attended is the attention backend's
to say (:func:`pair_counter`): a backend may count its own (a sliding window attends
fewer), and otherwise a backend whose spec ``honours`` ``doc_ids`` attends causally
within documents, any other causally over the whole row. Each attended pair costs ``4 * d_attn`` FLOPs forward
(``q.k`` and ``p*v``) and three times that for forward plus backward.

``d_attn`` (heads x head dim, summed over layers) is measured, not assumed: one forward of
a meta-device copy of the model around :class:`AttentionProbe` reads the
shapes every layer passed to ``attend``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from forge_core.api import DOC_IDS, INPUT_IDS, PairCountingBackend

#: The method of a module of whose parameters each token uses only a share.
ACTIVE_FRACTION = "active_fraction"


def _shares(model: torch.nn.Module) -> dict[int, float]:
    """The share of each parameter (by id) one token is computed with: the product of
    the ``active_fraction()`` of the modules above it (1 where none declares one); a
    parameter registered in several places takes its largest."""
    shares: dict[int, float] = {}

    def walk(module: torch.nn.Module, share: float) -> None:
        declare = getattr(module, ACTIVE_FRACTION, None)
        if callable(declare):
            share *= float(declare())
        for p in module.parameters(recurse=False):
            shares[id(p)] = max(shares.get(id(p), 0.0), share)
        for child in module.children():
            walk(child, share)

    walk(model, 1.0)
    return shares


def matmul_params(model: torch.nn.Module, active: bool = False) -> int:
    """Parameters that take part in matmuls: every parameter except embedding tables
    (counted once even when shared; a table tied to an output layer is counted).
    ``active``: count each parameter by the share of it one token uses
    (:func:`active_matmul_params`)."""
    embedding_only: set[int] = set()
    other: set[int] = set()
    for module in model.modules():
        target = embedding_only if isinstance(module, torch.nn.Embedding) else other
        target.update(id(p) for p in module.parameters(recurse=False))
    shares = _shares(model) if active else {}
    total = 0.0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in embedding_only and id(p) not in other:
            continue
        total += p.numel() * shares.get(id(p), 1.0)
    return round(total)


def active_matmul_params(model: torch.nn.Module) -> int:
    """The matmul parameters one token is computed with. A module of whose parameters
    (its own and its submodules') each token uses only a share has a method
    ``active_fraction() -> float`` giving it: routed experts, of which a token visits
    ``top_k`` of ``num_experts``, give ``top_k / num_experts``; a router or a shared
    expert, which every token passes, declares nothing. Equal to :func:`matmul_params`
    for a model that declares none."""
    return matmul_params(model, active=True)


def attended_pairs(doc_ids: torch.Tensor | None, batch: int, seq_len: int) -> int:
    """Query-key pairs computed by causal attention over a batch, with document masking
    when ``doc_ids`` (``(batch, seq)``, non-decreasing per row) is given."""
    if doc_ids is None:
        return batch * seq_len * (seq_len + 1) // 2
    ids = doc_ids.detach().cpu().numpy()
    # A run of equal ids starts at every row start and wherever the id changes; the
    # gaps between run starts are the documents' lengths. Vectorized, no per-token loop.
    starts = np.ones(ids.shape, dtype=bool)
    np.not_equal(ids[:, 1:], ids[:, :-1], out=starts[:, 1:])
    lengths = np.diff(np.flatnonzero(starts), append=ids.size)
    return int((lengths * (lengths + 1) // 2).sum())


def pair_counter(backend: Any, honours: frozenset[str]) -> Callable[[dict[str, torch.Tensor]], int]:
    """``count(batch) -> int``: the query-key pairs the run's attention computes for one
    batch, as the backend declares. A backend with ``attended_pairs(doc_ids, rows,
    seq_len) -> int`` counts its own (``doc_ids`` as the model hands them to its
    ``prepare``, or ``None``); otherwise :func:`attended_pairs`, with the batch's
    ``doc_ids`` only when the backend's spec ``honours`` them (``honours``)."""
    own = backend.attended_pairs if isinstance(backend, PairCountingBackend) else None
    masks_documents = DOC_IDS in honours

    def count(batch: dict[str, torch.Tensor]) -> int:
        rows, seq_len = batch[INPUT_IDS].shape[:2]
        doc_ids = batch.get(DOC_IDS)
        if own is not None:
            return int(own(doc_ids, rows, seq_len))
        return attended_pairs(doc_ids if masks_documents else None, rows, seq_len)

    return count


def step_flops(n_matmul_params: int, attn_width: int, input_tokens: int, pairs: int) -> float:
    """Forward plus backward FLOPs: ``6 N`` per input token plus ``12 d_attn`` per
    attended pair (``attn_width`` = heads x head dim summed over every layer)."""
    return 6.0 * n_matmul_params * input_tokens + 12.0 * attn_width * pairs


class AttentionProbe:
    """Wraps an attention backend and records ``heads * head_dim`` of every ``attend``
    call while ``recording``; everything else is delegated to the wrapped backend.

    While recording the backend itself is not run (``attend`` returns zeros shaped like
    the queries): the measurement needs only shapes, so it also works on a model still
    on the meta device, whatever the backend supports there."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.recording = False
        self.widths: list[int] = []

    def prepare(self, *args: Any, **kwargs: Any) -> Any:
        if self.recording:
            return None
        return self.inner.prepare(*args, **kwargs)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Any) -> torch.Tensor:
        if self.recording:
            self.widths.append(int(q.shape[1]) * int(q.shape[-1]))
            return torch.zeros_like(q)
        return self.inner.attend(q, k, v, prepared)

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this class does not define.
        return getattr(self.__dict__["inner"], name)


def measure_attention_width(model: torch.nn.Module, probe: AttentionProbe, device: Any) -> int:
    """Run one tiny forward with ``probe`` recording; returns ``d_attn`` summed over
    layers (0 when the model never calls the backend)."""
    probe.widths.clear()
    probe.recording = True
    try:
        with torch.no_grad():
            model(torch.zeros(1, 4, dtype=torch.long, device=device))
    finally:
        probe.recording = False
    return sum(probe.widths)
