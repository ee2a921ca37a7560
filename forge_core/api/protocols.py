"""The shape of each kind of implementation, stated in code.

Each ``Protocol`` says what the object a spec's ``impl`` builds must offer, as the hook
reference (:mod:`forge_core.hookspecs`) documents it; the conformance kit checks the
behaviour behind it. They are ``runtime_checkable``, so ``isinstance(obj, Packer)``
tells whether the methods are there (not whether they are right). Torch-free: tensors
and modules appear as ``Any``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from forge_core.api.packing import LazyPacker


@runtime_checkable
class AttentionBackend(Protocol):
    """Built as ``cls(options)``. ``prepare`` runs once per model forward and builds what
    every layer shares (a mask); ``attend`` takes ``q (B, heads, S, head_dim)`` and
    ``k``/``v (B, kv_heads, S, head_dim)`` and returns the shape of ``q``."""

    def prepare(self, doc_ids: Any, seq_len: int, device: Any) -> Any: ...

    def attend(self, q: Any, k: Any, v: Any, prepared: Any) -> Any: ...


#: A packer: built as ``cls(options, seq_len=..., eos_id=..., pad_id=...)``,
#: ``layout(lengths)`` places the documents into rows
#: (:class:`~forge_core.api.packing.LazyPacker`).
Packer = LazyPacker


@runtime_checkable
class Source(Protocol):
    """Built as ``cls(options)``; yields documents in a deterministic order."""

    def documents(self) -> Iterator[Any]: ...

    def describe(self) -> str: ...

    # Optional: ``fingerprint() -> str``, a string that changes whenever the documents
    # could (forge_core.api.files_fingerprint for a source that reads files); the token
    # cache is keyed by it. ``fingerprint_files() -> FileSet``: the files, hashed once
    # and checked by stat. ``token_documents(eos_id) -> TokenDocuments``: tokens read in
    # place, without the cache.


@runtime_checkable
class Tokenizer(Protocol):
    """Built as ``cls(options)``. ``identity`` changes whenever token ids would."""

    vocab_size: int
    eos_id: int
    pad_id: int
    identity: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, directory: str) -> None: ...


@runtime_checkable
class Strategy(Protocol):
    """A parallelism strategy, built as ``cls(options)``. ``apply`` returns the module
    to use in place of ``model`` (often ``model`` itself, changed in place), or a
    :class:`~forge_core.api.parallel.ModelSplit` when it splits the model; it is called
    once per model part (every pipeline stage a process holds).

    Optional: ``batch_transform(ctx) -> transform | None``, called once after ``apply``
    (whatever the number of parts): ``transform(batch) -> batch`` is applied to every
    batch this process trains or evaluates on, before the model and before a pipeline
    cuts it into microbatches, in the order strategies are applied. ``batch`` maps
    ``input_ids``, ``labels`` and the per-token metadata (``doc_ids``, ``positions``)
    to ``(B, S)`` tensors; a transform may shorten the rows (a context-parallel rank
    keeps its share of every row) or add metadata the model accepts. The labelled
    tokens a step is normalised by are counted before any transform; a strategy whose
    transform splits tokens over its ranks declares it on its dimension
    (:attr:`~forge_core.api.MeshDim.splits_tokens`), so each loss sum is added over them."""

    def apply(self, model: Any, ctx: Any) -> Any: ...


@runtime_checkable
class ParallelModule(Protocol):
    """A model (the ``nn.Module`` its factory returns) that tells the strategies how it
    is split and sharded: ``parallel_contract()`` returns a
    :class:`~forge_core.api.parallel.ParallelContract`. Its spec's ``supports`` says
    which pieces of the contract are filled in."""

    def parallel_contract(self) -> Any: ...
