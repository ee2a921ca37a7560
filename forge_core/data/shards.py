"""The on-disk format of pre-tokenized shards (written by ``forge-run prepare``).

A shard directory (format version 2) holds four files and the tokenizer that made them:

- ``tokens.bin``: every document's tokens, back to back, no EOS (the pipeline appends
  EOS when it reads them, exactly as it does for text), as raw little-endian integers
  of ``dtype`` (``uint16`` when the vocabulary fits, else ``uint32``), read through
  ``np.memmap``;
- ``offsets.npy``: int64, ``num_documents + 1`` entries; document ``i`` is
  ``tokens[offsets[i]:offsets[i + 1]]``;
- ``hashes.npy``: uint64, one per document: the first 8 bytes (little-endian) of the
  BLAKE2b hash of the document's content as the source gave it (its UTF-8 text, or
  its token ids as little-endian int64 for a pre-tokenized source), computed while
  tokenizing. The held-out split is decided by it (:mod:`forge_core.data.heldout`);
- ``index.json``: ``format``, ``version``, ``dtype``, ``num_tokens``,
  ``num_documents``, ``tokenizer`` (``identity``, ``vocab_size``, ``eos_id``,
  ``pad_id``), ``source`` (the source's one-line description), ``tokens_sha256`` (of
  ``tokens.bin``, for provenance), the three file names, and for a cache entry
  ``cache`` (the key and the source fingerprint it was made for);
- ``tokenizer/``: what the tokenizer's ``save`` wrote (a Hugging Face tokenizer's
  files; nothing for the byte tokenizer).

The directory is written under ``<dir>.partial`` and renamed to ``<dir>`` only once
complete; ``index.json`` is written last. A ``.partial`` directory is therefore the
trace of an interrupted prepare, and a directory without ``index.json`` is not a shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from forge_core.api import ForgeError
from forge_core.data.packed_rows import DocumentStream
from forge_core.data.shard_index import FORMAT, INDEX, PARTIAL_SUFFIX, VERSION, partial_dir, read_index

TOKENS = "tokens.bin"
OFFSETS = "offsets.npy"
HASHES = "hashes.npy"
TOKENIZER_DIR = "tokenizer"

__all__ = ["FORMAT", "HASHES", "INDEX", "OFFSETS", "PARTIAL_SUFFIX", "TOKENIZER_DIR", "TOKENS", "VERSION",
           "ShardWriter", "Shards", "move_into_place", "partial_dir", "read_index", "token_dtype"]


def move_into_place(tmp: Path, out: Path) -> None:
    """Rename the complete directory ``tmp`` to ``out``. An existing ``out`` is moved
    aside first and removed only once ``tmp`` has taken its place."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype holding every id below ``vocab_size``."""
    if vocab_size <= 1 << 16:
        return np.dtype("<u2")
    if vocab_size <= 1 << 32:
        return np.dtype("<u4")
    raise ForgeError(f"vocabulary of {vocab_size} ids is too large for a shard (at most 2**32).")


class ShardWriter:
    """Appends documents into ``tmp`` (default ``<out_dir>.partial``); :meth:`commit`
    makes it ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike, tokenizer: dict[str, Any], tmp: Path | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.tmp = partial_dir(out_dir) if tmp is None else Path(tmp)
        self.tokenizer = tokenizer
        self.dtype = token_dtype(int(tokenizer["vocab_size"]))
        self.tmp.mkdir(parents=True)
        self._tokens = open(self.tmp / TOKENS, "wb")
        self._lengths: list[int] = []
        self._hashes: list[np.ndarray] = []
        self._digest = hashlib.sha256()
        self.num_tokens = 0

    @property
    def num_documents(self) -> int:
        return len(self._lengths)

    def add(self, documents: list[np.ndarray], hashes: np.ndarray) -> None:
        """Append documents (1-D integer arrays, no EOS) and their content hashes (uint64)."""
        if not documents:
            return
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
        data = flat.astype(self.dtype).tobytes()
        self._tokens.write(data)
        self._digest.update(data)
        self._hashes.append(np.asarray(hashes, dtype="<u8"))
        self._lengths.extend(len(d) for d in documents)
        self.num_tokens += int(flat.size)

    def commit(self, source: str, replace: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Finish the files, write ``index.json`` last (with ``extra`` fields), flush
        everything to disk, rename into place."""
        self._tokens.flush()
        os.fsync(self._tokens.fileno())
        self._tokens.close()
        offsets = np.zeros(len(self._lengths) + 1, np.int64)
        np.cumsum(np.asarray(self._lengths, np.int64), out=offsets[1:])
        _save_synced(self.tmp / OFFSETS, offsets)
        hashes = np.concatenate(self._hashes) if self._hashes else np.zeros(0, "<u8")
        _save_synced(self.tmp / HASHES, hashes)
        index = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype.name,
            "num_tokens": self.num_tokens,
            "num_documents": len(self._lengths),
            "tokenizer": self.tokenizer,
            "source": source,
            "tokens_sha256": self._digest.hexdigest(),
            "files": {"tokens": TOKENS, "offsets": OFFSETS, "hashes": HASHES},
            **(extra or {}),
        }
        with open(self.tmp / INDEX, "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if replace:
            move_into_place(self.tmp, self.out_dir)
        else:
            os.replace(self.tmp, self.out_dir)
        return index

    def abort(self) -> None:
        """Remove the partial directory (after an error: nothing half-written remains)."""
        self._tokens.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _save_synced(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


class Shards:
    """A complete shard directory, validated on open; tokens are memory-mapped, the
    per-document offsets and hashes are read into memory (16 bytes per document)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        index = read_index(self.path)  # everything but the offsets; shared with `check`
        self.index = index
        self.dtype = np.dtype(index["dtype"])
        self.num_tokens = int(index["num_tokens"])
        self.num_documents = int(index["num_documents"])
        self.tokenizer = dict(index["tokenizer"])
        tokens_path = self.path / index["files"]["tokens"]
        offsets_path = self.path / index["files"]["offsets"]
        hashes_path = self.path / index["files"]["hashes"]
        self.tokens_path = tokens_path
        try:
            self.offsets = np.load(offsets_path)
            self.hashes = np.load(hashes_path)
        except (OSError, ValueError) as exc:
            raise ForgeError(f"{self.path}: cannot read its offsets or hashes ({exc}); the shard is damaged.") from None
        if self.hashes.shape != (self.num_documents,) or self.hashes.dtype != np.dtype("<u8"):
            raise ForgeError(f"{hashes_path}: {self.hashes.shape} {self.hashes.dtype}, expected "
                             f"{self.num_documents} uint64 hashes; the shard is damaged.")
        o = self.offsets
        if (
            o.ndim != 1
            or len(o) != self.num_documents + 1
            or (len(o) and (o[0] != 0 or o[-1] != self.num_tokens))
            or np.any(np.diff(o) < 0)
        ):
            raise ForgeError(f"{offsets_path}: offsets do not match the index; the shard is damaged.")
        if self.num_tokens:
            self.tokens = np.memmap(tokens_path, dtype=self.dtype, mode="r", shape=(self.num_tokens,))
        else:  # np.memmap refuses an empty file
            self.tokens = np.zeros(0, self.dtype)

    def __len__(self) -> int:
        return self.num_documents

    def stream(self, eos_id: int, vocab_size: int, documents: np.ndarray | None = None) -> DocumentStream:
        """The documents (all, or those numbered in ``documents``) as the packer's stream,
        EOS appended, every id read checked against ``vocab_size``."""
        index = np.arange(self.num_documents) if documents is None else np.asarray(documents, np.int64)
        start = self.offsets[:-1][index]
        return DocumentStream(self.tokens, start, self.offsets[1:][index] - start, eos_id,
                              vocab_size=vocab_size, where=str(self.tokens_path), document_index=index)

    def documents(self) -> Iterator[np.ndarray]:
        """Every document as a read-only view into the memory map, in order."""
        tokens, offsets = self.tokens, self.offsets.tolist()
        for i in range(self.num_documents):
            yield tokens[offsets[i] : offsets[i + 1]]
