"""Source -> tokenizer: documents tokenized in batches, each with its content hash.

Contract with the components (see the hook docstrings): a source's ``documents()``
yields ``str``, or 1-D token arrays when it is pre-tokenized, or
:class:`~forge_core.api.MaskedDocument` (token ids with a trainable mask: the tokens
that take a loss; the cache stores the mask beside the ids). A pre-tokenized source
may expose ``tokenizer_identity``; the pipeline refuses a tokenizer whose ``identity``
differs, and checks every pre-tokenized id against the tokenizer's vocabulary. Text is
encoded with ``tokenizer.encode_batch(texts)`` when the tokenizer has it, else
``encode`` per document. EOS is not part of a tokenized document: the packer's stream
appends it (:class:`forge_core.data.packed_rows.DocumentStream`).

Every document also gets a content hash (:func:`document_hashes`): what the held-out
split is decided by, so it does not depend on the tokenizer or on where the document
sits in the corpus.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from forge_core.api import BatchEncodingTokenizer, ForgeError, MaskedDocument
from forge_core.api.shards import token_document_hash

#: Documents encoded per ``encode_batch`` call.
BATCH_DOCS = 256


def check_tokenizer(source: Any, tokenizer: Any) -> None:
    """Refuse pre-tokenized data made with another tokenizer."""
    made_with = getattr(source, "tokenizer_identity", None)
    if made_with is not None and made_with != tokenizer.identity:
        raise ForgeError(
            f"{source.describe()} was tokenized with {made_with!r}, but the configured "
            f"tokenizer is {tokenizer.identity!r}. Use the tokenizer it was prepared with, "
            "or run `forge-run prepare` again with this one."
        )


def document_hash(document: Any) -> bytes:
    """8 bytes of BLAKE2b over a document's content: its UTF-8 text, or its token ids as
    little-endian int64 (a pre-tokenized document), followed for a masked document by
    its mask (one byte per token), or the masked document's own ``content``."""
    if isinstance(document, MaskedDocument):
        if document.content is not None:
            return hashlib.blake2b(document.content, digest_size=8).digest()
        data = np.ascontiguousarray(document.ids, dtype="<i8").tobytes() + document.trainable.tobytes()
        return hashlib.blake2b(data, digest_size=8).digest()
    if not isinstance(document, str):
        return token_document_hash(document)
    return hashlib.blake2b(document.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()


def document_hashes(documents: list[Any]) -> np.ndarray:
    """:func:`document_hash` of each document, as uint64."""
    return np.frombuffer(b"".join(document_hash(d) for d in documents), dtype="<u8").copy()


def tokenize(
    source: Any, tokenizer: Any, *, progress: bool = True
) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
    """Batches of ``(tokenized documents, their content hashes)`` in source order: int32
    arrays without EOS (a :class:`~forge_core.api.MaskedDocument` of them when the
    source gave a mask), and uint64 hashes of the documents as the source gave them.

    Pre-tokenized ids outside ``[0, vocab_size)`` are an error naming the document.
    Shows a progress bar on stderr once tokenizing has taken more than two seconds.
    """
    check_tokenizer(source, tokenizer)
    vocab = int(tokenizer.vocab_size)
    encode_batch = tokenizer.encode_batch if isinstance(tokenizer, BatchEncodingTokenizer) else None
    index = 0  # documents seen so far, for error messages
    with _progress(progress) as bar:
        for batch in _batches(source.documents(), BATCH_DOCS):
            texts = [d for d in batch if isinstance(d, str)]
            encoded = iter(
                (encode_batch(texts) if encode_batch else [tokenizer.encode(t) for t in texts])
                if texts
                else ()
            )
            arrays = [_ids(d) for d in batch]
            if len(texts) < len(batch):
                _check_ids(arrays, vocab, index, source)
            out = [
                np.asarray(next(encoded) if isinstance(a, str) else a).astype(np.int32, copy=False)
                for a in arrays
            ]
            out = [
                MaskedDocument(a, d.trainable) if isinstance(d, MaskedDocument) else a
                for a, d in zip(out, batch)
            ]
            index += len(batch)
            bar.update(len(batch), sum(len(d) for d in out))
            yield out, document_hashes(batch)


def _ids(document: Any) -> Any:
    """A document's text, or its token ids as a 1-D array."""
    if isinstance(document, str):
        return document
    if isinstance(document, MaskedDocument):
        return document.ids
    return np.asarray(document).reshape(-1)


def _check_ids(docs: list[Any], vocab: int, first_index: int, source: Any) -> None:
    """Pre-tokenized ids must lie in ``[0, vocab)``; ``docs`` may mix in text (skipped)."""
    arrays = [d for d in docs if not isinstance(d, str) and d.size]
    if not arrays:
        return
    flat = np.concatenate(arrays)
    if flat.min() >= 0 and flat.max() < vocab:
        return
    for i, d in enumerate(docs):
        if isinstance(d, str):
            continue
        bad = d[(d < 0) | (d >= vocab)]
        if bad.size:
            raise ForgeError(
                f"{source.describe()}: document {first_index + i} holds token id "
                f"{int(bad[0])}, outside the tokenizer's vocabulary of {vocab} ids. The "
                "data is damaged or was made for another tokenizer."
            )


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _progress:
    """A tqdm bar on stderr that appears only after two seconds (no noise on small
    corpora) and degrades to nothing when tqdm is missing or ``enabled`` is False."""

    def __init__(self, enabled: bool) -> None:
        self.bar = None
        self.tokens = 0
        self.last = 0.0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(desc="tokenizing", unit=" docs", file=sys.stderr, delay=2.0, dynamic_ncols=True)

    def __enter__(self) -> _progress:
        return self

    def update(self, docs: int, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(docs)
            now = time.monotonic()
            if now - self.last > 0.5:
                self.bar.set_postfix(tokens=f"{self.tokens:,}", refresh=False)
                self.last = now

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
