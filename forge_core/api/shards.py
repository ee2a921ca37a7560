"""The on-disk format of pre-tokenized shards (written by ``forge-run prepare``) and its
reader, :class:`Shards`, for a source plugin that reads them (the built-in ``shards``
source). :func:`read_shard_index` validates a directory from its index and file sizes
alone (json, no numpy), so ``forge-run check`` judges a path in milliseconds; ``Shards``
opens through it, so check and build refuse the same directories with the same words.
This module imports numpy only when a ``Shards`` is opened. :class:`TokenDocuments`
(the base of ``Shards``) is what a source of another token format (a Megatron indexed
dataset, a flat token file) gives the run: documents in one memory-mapped array.

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
  files; nothing for the byte tokenizer);
- ``trainable.bin`` (only when some document carries a trainable mask, and then named
  in ``files`` as ``trainable``): one byte per token, 1 where the token takes a loss
  (an assistant token of a conversation), 0 where it does not (its prompt). A shard
  without it is all trainable. How the mask becomes labels:
  :class:`forge_core.data.packed_rows.PackedRows`.

The directory is written in a temporary directory beside it
(:func:`~forge_core.api.files.temporary_dir`, ``.<dir>.forge-partial-<random>``) and
renamed to ``<dir>`` only once complete; ``index.json`` is written last. Such a
temporary is therefore the trace of a prepare running or interrupted, and a directory
without ``index.json`` is not a shard.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forge_core.api.errors import ForgeError
from forge_core.api.files import leftover_temporaries

TOKENS = "tokens.bin"
OFFSETS = "offsets.npy"
HASHES = "hashes.npy"
TRAINABLE = "trainable.bin"
TOKENIZER_DIR = "tokenizer"
FORMAT = "forge-shards"
VERSION = 2
INDEX = "index.json"
#: Bytes per token of each dtype ``forge-run prepare`` writes.
ITEMSIZE = {"uint16": 2, "uint32": 4}


def read_shard_index(path: str | os.PathLike) -> dict[str, Any]:
    """The index of a complete shard directory; a :class:`ForgeError` saying what is wrong
    otherwise (missing, interrupted, not a shard index, another format version, a data
    file missing or of the wrong size)."""
    path = Path(path)
    index_path = path / INDEX
    if not path.is_dir():
        partial = leftover_temporaries(path, running=True)
        if partial:
            raise ForgeError(
                f"{path}: not there, but {partial[0]} is: a `forge-run prepare` into it is "
                "running or was interrupted. Wait for it to finish, or run it again (it removes "
                "what an interrupted one left)."
            )
        if path.exists():
            raise ForgeError(f"{path}: not a directory; give the directory `forge-run prepare` wrote.")
        raise ForgeError(f"{path}: no such shard directory. Create it with `forge-run prepare`.")
    if not index_path.is_file():
        raise ForgeError(f"{index_path}: missing; {path} is not a complete `forge-run prepare` output.")
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ForgeError(f"{index_path}: not valid JSON ({exc}).") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ForgeError(f"{index_path}: not a Forge shard index (format {FORMAT!r} expected).")
    if index.get("version") != VERSION:
        raise ForgeError(
            f"{index_path}: shard format version {index.get('version')}, this Forge reads "
            f"version {VERSION}. Run `forge-run prepare` again."
        )
    try:
        files = index["files"]
        tokens_path, offsets_path, hashes_path = (path / files[k] for k in ("tokens", "offsets", "hashes"))
        itemsize = ITEMSIZE[index["dtype"]]
        num_tokens, num_documents = int(index["num_tokens"]), int(index["num_documents"])
        identity = index["tokenizer"]["identity"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ForgeError(
            f"{index_path}: incomplete or damaged index ({type(exc).__name__}: {exc})."
        ) from None
    if num_tokens < 0 or num_documents < 0 or not isinstance(identity, str):
        raise ForgeError(f"{index_path}: damaged index (negative counts or no tokenizer identity).")
    for p in (tokens_path, offsets_path, hashes_path):
        if not p.is_file():
            raise ForgeError(f"{p}: missing from the shard directory {path}.")
    expected = num_tokens * itemsize
    if tokens_path.stat().st_size != expected:
        raise ForgeError(
            f"{tokens_path}: {tokens_path.stat().st_size} bytes, the index says "
            f"{num_tokens} tokens of {index['dtype']} ({expected} bytes). The "
            "shard is damaged: run `forge-run prepare` again."
        )
    if files.get("trainable"):
        mask_path = path / files["trainable"]
        size = mask_path.stat().st_size if mask_path.is_file() else None
        if size != num_tokens:
            found = "missing" if size is None else f"{size} bytes"
            raise ForgeError(
                f"{mask_path}: {found}, the index says {num_tokens} tokens (one byte of trainable "
                "mask each). The shard is damaged: run `forge-run prepare` again."
            )
    return index


def token_document_hash(tokens: Any) -> bytes:
    """The content hash of a pre-tokenized document (what ``hashes.npy`` stores, and
    what the held-out split is decided by): 8 bytes of BLAKE2b over its ids as
    little-endian int64."""
    import hashlib

    import numpy as np

    data = np.ascontiguousarray(np.asarray(tokens).reshape(-1), dtype="<i8").tobytes()
    return hashlib.blake2b(data, digest_size=8).digest()


class MaskedDocument:
    """A tokenized document whose tokens do not all take a loss: ``ids`` (1-D integers,
    no EOS) and ``trainable`` (one bool per id, True where the token is a target, for
    example a conversation's assistant tokens). What a tokenizer's ``encode_chat``
    returns and what a source may yield in place of text; the token cache stores the
    mask beside the ids (``trainable.bin``). ``content``, when given, is the bytes the
    held-out split hashes (a chat record's JSON) instead of the ids and the mask."""

    __slots__ = ("content", "ids", "trainable")

    def __init__(self, ids: Any, trainable: Any, content: bytes | None = None) -> None:
        import numpy as np

        self.content = content
        self.ids = np.asarray(ids).reshape(-1)
        self.trainable = np.asarray(trainable, dtype=bool).reshape(-1)
        if self.ids.shape != self.trainable.shape:
            raise ValueError(f"{len(self.ids)} token ids but {len(self.trainable)} trainable flags")

    def __len__(self) -> int:
        return len(self.ids)


class TokenDocuments:
    """Documents that already are tokens, read in place: document ``i`` is
    ``tokens[starts[i] : starts[i] + counts[i]]`` (no EOS: the run appends it). A source
    that reads a token format exposes one through ``token_documents(eos_id)`` (a shard
    directory, through ``shards``); the run memory-maps it without the token cache.

    ``tokens``: a 1-D integer array (a ``np.memmap`` of the file, for a corpus of any
    size); ``starts`` and ``counts``: int64, one per document, inside ``tokens``;
    ``path``: the file named in messages. ``hashes`` (one per document,
    :func:`token_document_hash`) are computed when first read, one pass over the
    tokens: only a held-out split needs them. ``trainable``: ``None`` (every token takes
    a loss) or one byte per token of ``tokens``, nonzero where it does."""

    #: One byte per token (nonzero: the token takes a loss), or None: all trainable.
    trainable: Any = None

    def __init__(
        self, tokens: Any, starts: Any, counts: Any, path: str | os.PathLike, trainable: Any = None
    ) -> None:
        import numpy as np

        self.path = Path(path)
        self.tokens_path = self.path
        self.tokens = tokens
        if trainable is not None and len(trainable) != len(tokens):
            raise ForgeError(f"{self.path}: {len(trainable)} trainable flags for {len(tokens)} tokens.")
        self.trainable = trainable
        self.dtype = np.dtype(tokens.dtype)
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.counts = np.ascontiguousarray(counts, dtype=np.int64)
        self.num_tokens = int(len(tokens))
        self.num_documents = len(self.starts)
        if (
            self.starts.shape != self.counts.shape
            or self.starts.ndim != 1
            or (self.num_documents and (self.starts.min() < 0 or self.counts.min() < 0))
            or (self.num_documents and int((self.starts + self.counts).max()) > self.num_tokens)
        ):
            raise ForgeError(f"{self.path}: document bounds fall outside its {self.num_tokens} tokens.")

    @functools.cached_property
    def hashes(self) -> Any:
        import numpy as np

        digests = b"".join(token_document_hash(d) for d in self.documents())
        return np.frombuffer(digests, dtype="<u8").copy()

    def __len__(self) -> int:
        return self.num_documents

    def documents(self) -> Iterator[Any]:
        """Every document as a read-only view into the tokens, in order."""
        tokens = self.tokens
        for start, count in zip(self.starts.tolist(), self.counts.tolist()):
            yield tokens[start : start + count]


class Shards(TokenDocuments):
    """A complete shard directory, validated on open; tokens, per-document offsets and
    hashes are all memory-mapped (pages the kernel reads on demand and may drop), so an
    open directory holds no per-document memory of its own."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        import numpy as np

        index = read_shard_index(self.path)  # everything but the offsets; shared with `check`
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
            self.offsets = np.load(offsets_path, mmap_mode="r")
            self.hashes = np.load(hashes_path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise ForgeError(
                f"{self.path}: cannot read its offsets or hashes ({exc}); the shard is damaged."
            ) from None
        if self.hashes.shape != (self.num_documents,) or self.hashes.dtype != np.dtype("<u8"):
            raise ForgeError(
                f"{hashes_path}: {self.hashes.shape} {self.hashes.dtype}, expected "
                f"{self.num_documents} uint64 hashes; the shard is damaged."
            )
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
        mask_file = index["files"].get("trainable")
        if mask_file:
            mask_path = self.path / mask_file
            self.trainable = (
                np.memmap(mask_path, dtype=np.uint8, mode="r", shape=(self.num_tokens,))
                if self.num_tokens
                else np.zeros(0, np.uint8)
            )

    @property
    def starts(self) -> Any:
        return self.offsets[:-1]

    @property
    def counts(self) -> Any:
        import numpy as np

        return np.diff(self.offsets)
