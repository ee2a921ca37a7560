"""Writing pre-tokenized shards (``forge-run prepare``, the token cache) and reading them
as the packer's document stream. The format and its reader are
:mod:`forge_core.api.shards`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from forge_core.api import ForgeError
from forge_core.api.files import move_into_place, temporary_dir
from forge_core.api.shards import (
    FORMAT,
    HASHES,
    INDEX,
    OFFSETS,
    TOKENIZER_DIR,
    TOKENS,
    TRAINABLE,
    VERSION,
    MaskedDocument,
    Shards,
    TokenDocuments,
    read_shard_index,
)
from forge_core.data.packed_rows import DocumentStream

__all__ = [
    "FORMAT",
    "HASHES",
    "INDEX",
    "OFFSETS",
    "TOKENIZER_DIR",
    "TOKENS",
    "VERSION",
    "ShardWriter",
    "Shards",
    "read_shard_index",
    "stream",
    "token_dtype",
]


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding every id below ``vocab_size``."""
    if vocab_size <= 1 << 16:
        return np.dtype("<u2")
    if vocab_size <= 1 << 32:
        return np.dtype("<u4")
    raise ForgeError(f"vocabulary of {vocab_size} ids is too large for a shard (at most 2**32).")


class ShardWriter:
    """Appends documents into ``tmp`` (by default a new
    :func:`~forge_core.api.files.temporary_dir` beside ``out_dir``; a given one is
    created here, and must not exist); :meth:`commit` makes it ``out_dir``."""

    def __init__(
        self, out_dir: str | os.PathLike, tokenizer: dict[str, Any], tmp: Path | None = None
    ) -> None:
        self.out_dir = Path(out_dir)
        self.tokenizer = tokenizer
        self.dtype = token_dtype(int(tokenizer["vocab_size"]))
        if tmp is None:
            self.tmp = temporary_dir(self.out_dir)
        else:
            self.tmp = Path(tmp)
            self.tmp.mkdir(parents=True)
        self._tokens = open(self.tmp / TOKENS, "wb")
        self._mask: Any = None  # trainable.bin, opened at the first masked document
        self.trainable_tokens = 0  # counted once there is a mask
        self._lengths: list[int] = []
        self._hashes: list[np.ndarray] = []
        self._digest = hashlib.sha256()
        self.num_tokens = 0

    @property
    def num_documents(self) -> int:
        return len(self._lengths)

    def add(self, documents: list[Any], hashes: np.ndarray) -> None:
        """Append documents (1-D integer arrays, no EOS, or
        :class:`~forge_core.api.MaskedDocument`) and their content hashes (uint64).
        ``trainable.bin`` is written once some document has a mask (the documents
        before it, and every plain array, count as all trainable)."""
        if not documents:
            return
        masks = [d.trainable if isinstance(d, MaskedDocument) else None for d in documents]
        documents = [d.ids if isinstance(d, MaskedDocument) else d for d in documents]
        if len(hashes) != len(documents):
            raise ValueError(f"{len(documents)} documents but {len(hashes)} hashes")
        flat = np.concatenate(documents)
        vocab = int(self.tokenizer["vocab_size"])
        # Narrowing to the shard dtype would wrap a bad id silently: refuse it here.
        if flat.size:
            lo, hi = int(flat.min()), int(flat.max())
            if lo < 0 or hi >= vocab:
                raise ForgeError(
                    f"token id {hi if hi >= vocab else lo} is outside the tokenizer's "
                    f"vocabulary of {vocab} ids."
                )
        if self._mask is None and any(m is not None for m in masks):
            self._mask = open(self.tmp / TRAINABLE, "wb")
            self._mask.write(np.ones(self.num_tokens, np.uint8).tobytes())
            self.trainable_tokens = self.num_tokens
        if self._mask is not None:
            bits = np.concatenate(
                [
                    np.ones(len(d), np.uint8) if m is None else m.astype(np.uint8)
                    for d, m in zip(documents, masks)
                ]
            )
            self._mask.write(bits.tobytes())
            self.trainable_tokens += int(bits.sum())
        data = flat.astype(self.dtype).tobytes()
        self._tokens.write(data)
        self._digest.update(data)
        self._hashes.append(np.asarray(hashes, dtype="<u8"))
        self._lengths.extend(len(d) for d in documents)
        self.num_tokens += int(flat.size)

    def commit(
        self, source: str, replace: bool = False, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Finish the files, write ``index.json`` last (with ``extra`` fields) and move the
        directory into place (:func:`~forge_core.api.files.move_into_place` flushes it to
        disk first); ``replace`` allows an existing ``out_dir`` to be replaced."""
        self._tokens.close()
        files = {"tokens": TOKENS, "offsets": OFFSETS, "hashes": HASHES}
        mask_fields: dict[str, Any] = {}
        if self._mask is not None:
            self._mask.close()
            files["trainable"] = TRAINABLE
            mask_fields["num_trainable_tokens"] = self.trainable_tokens
        offsets = np.zeros(len(self._lengths) + 1, np.int64)
        np.cumsum(np.asarray(self._lengths, np.int64), out=offsets[1:])
        np.save(self.tmp / OFFSETS, offsets)
        np.save(self.tmp / HASHES, np.concatenate(self._hashes) if self._hashes else np.zeros(0, "<u8"))
        index = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype.name,
            "num_tokens": self.num_tokens,
            "num_documents": len(self._lengths),
            "tokenizer": self.tokenizer,
            "source": source,
            "tokens_sha256": self._digest.hexdigest(),
            "files": files,
            **mask_fields,
            **(extra or {}),
        }
        with open(self.tmp / INDEX, "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
        move_into_place(self.tmp, self.out_dir, replace=replace)
        return index

    def abort(self) -> None:
        """Remove the partial directory (after an error: nothing half-written remains).
        It is the one this writer created, so it holds nothing else."""
        self._tokens.close()
        if self._mask is not None:
            self._mask.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def stream(
    shards: TokenDocuments, eos_id: int, vocab_size: int, documents: np.ndarray | None = None
) -> DocumentStream:
    """The documents (all, or those numbered in ``documents``) as the packer's stream,
    EOS appended, every id read checked against ``vocab_size``, with their trainable
    mask when the shards have one. Every document (``documents`` None) is read through
    the shards' own starts, a view (of the memory-mapped offsets, for a shard
    directory), not a copy."""
    if documents is None:
        starts, counts, index = shards.starts, shards.counts, None
    else:
        index = np.asarray(documents, np.int64)
        starts, counts = shards.starts[index], shards.counts[index]
    return DocumentStream(
        shards.tokens,
        starts,
        counts,
        eos_id,
        vocab_size=vocab_size,
        where=str(shards.tokens_path),
        document_index=index,
        trainable=getattr(shards, "trainable", None),
    )
