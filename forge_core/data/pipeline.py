"""Source -> tokenizer -> packer: the rows a run trains on.

Contract with the components (see the hook docstrings): a source's ``documents()``
yields ``str``, or 1-D token arrays when it is pre-tokenized. A pre-tokenized source
may expose ``tokenizer_identity``; the pipeline refuses a tokenizer whose ``identity``
differs, and checks every pre-tokenized id against the tokenizer's vocabulary. Text is
encoded with ``tokenizer.encode_batch(texts)`` when the tokenizer has it, else
``encode`` per document. Every document, text or tokens, gets ``eos_id`` appended.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from forge_core.api import INPUT_IDS, LABELS, ForgeError

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


def tokenize(source: Any, tokenizer: Any, *, progress: bool = True) -> Iterator[list[np.ndarray]]:
    """Batches of tokenized documents (int32 arrays, no EOS), in source order.

    Pre-tokenized ids outside ``[0, vocab_size)`` are an error naming the document.
    Shows a progress bar on stderr once tokenizing has taken more than two seconds.
    """
    check_tokenizer(source, tokenizer)
    vocab = int(tokenizer.vocab_size)
    encode_batch = getattr(tokenizer, "encode_batch", None)
    index = 0  # documents seen so far, for error messages
    with _progress(progress) as bar:
        for batch in _batches(source.documents(), BATCH_DOCS):
            texts = [d for d in batch if isinstance(d, str)]
            encoded = iter(
                (encode_batch(texts) if encode_batch else [tokenizer.encode(t) for t in texts])
                if texts
                else ()
            )
            arrays = [d if isinstance(d, str) else np.asarray(d).reshape(-1) for d in batch]
            if len(texts) < len(batch):
                _check_ids(arrays, vocab, index, source)
            out = [
                np.asarray(next(encoded) if isinstance(a, str) else a).astype(np.int32, copy=False)
                for a in arrays
            ]
            index += len(batch)
            bar.update(len(batch), sum(len(d) for d in out))
            yield out


def documents_with_eos(source: Any, tokenizer: Any, *, progress: bool = True) -> list[np.ndarray]:
    """Every document of ``source`` tokenized, with ``tokenizer.eos_id`` appended."""
    eos = int(tokenizer.eos_id)
    docs = []
    for batch in tokenize(source, tokenizer, progress=progress):
        for ids in batch:
            doc = np.empty(len(ids) + 1, np.int32)
            doc[:-1] = ids
            doc[-1] = eos
            docs.append(doc)
    return docs


def build_rows(source: Any, tokenizer: Any, packer: Any, *, progress: bool = True) -> dict[str, np.ndarray]:
    """Tokenize ``source``, append EOS, pack: the int64 ``(rows, seq_len)`` arrays.

    A corpus that fills no row is an error, and so is packer output that breaks the
    packer contract (missing ``input_ids``/``labels``, arrays of different shapes).
    """
    docs = documents_with_eos(source, tokenizer, progress=progress)
    if not docs:
        raise ForgeError(f"{source.describe()}: the source yielded no document.")
    rows = packer.pack(docs)
    for key in (INPUT_IDS, LABELS):
        if key not in rows:
            raise ForgeError(f"packer {type(packer).__name__} returned no {key!r}.")
    shape = rows[INPUT_IDS].shape
    for key, value in rows.items():
        if value.ndim != 2 or value.shape != shape:
            raise ForgeError(
                f"packer {type(packer).__name__}: {key!r} has shape {value.shape}, "
                f"input_ids {shape}; every array must be (rows, seq_len)."
            )
    if shape[0] == 0:
        tokens = sum(len(d) for d in docs)
        seq_len = getattr(packer, "seq_len", shape[1])
        raise ForgeError(
            f"{source.describe()}: {tokens} tokens in {len(docs)} documents, not enough "
            f"for one row of seq_len {seq_len} ({type(packer).__name__}). Add data or "
            "lower data.seq_len."
        )
    return {k: np.ascontiguousarray(v, dtype=np.int64) for k, v in rows.items()}


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
