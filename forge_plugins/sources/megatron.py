"""The ``megatron`` source: a Megatron-LM indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``),
read in place through numpy memory maps, no token cache.

The layout (Megatron-LM ``megatron/core/datasets/indexed_dataset.py``, ``MMIDIDX`` version 1),
all little-endian:

- ``.idx``: the magic ``b"MMIDIDX\\x00\\x00"``; the version ``<Q`` (1); the token dtype code
  ``<B`` (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16);
  the sequence count ``<Q``; the document count ``<Q`` (documents + 1); then int32
  sequence lengths (tokens), int64 sequence pointers (byte offsets into ``.bin``), int64
  document indices (the first sequence of each document, then the sequence count); a
  multimodal index adds one int8 mode per sequence, ignored here.
- ``.bin``: the tokens of every sequence, back to back.

A document is its sequences, contiguous in ``.bin`` (one sequence per document unless
the data was split into sentences). With ``append_eod`` the EOS that ends each document
is checked and dropped: Forge appends EOS to every document itself. The header and sizes
are checked by ``forge-run check`` (:func:`read_header`, no numpy); the tokens' dtype
against the tokenizer's vocabulary and every id read against it, when the run builds.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Any

from forge_core.api import ForgeError, TokenDocuments

OPTION = "$.data.source_options"
MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = len(MAGIC) + 8 + 1 + 8 + 8
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
ITEMSIZE = {
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "float64": 8,
    "float32": 4,
    "uint16": 2,
}


def pair(path: str) -> tuple[str, str]:
    """``(PREFIX.bin, PREFIX.idx)`` of a prefix, or of either file's path."""
    if not path:
        raise ForgeError(f"{OPTION}.path is empty: give the prefix of a Megatron PREFIX.bin/PREFIX.idx pair.")
    prefix = path[:-4] if path.endswith((".bin", ".idx")) else path
    return prefix + ".bin", prefix + ".idx"


def read_header(path: str) -> dict[str, Any]:
    """The index header of the pair at ``path``, its sizes checked against both files;
    an error naming ``$.data.source_options.path`` and the file otherwise."""
    bin_path, idx_path = pair(path)
    for p in (idx_path, bin_path):
        if not os.path.isfile(p):
            raise ForgeError(
                f"{OPTION}.path: {p} does not exist (the prefix {path!r} names {bin_path} and {idx_path})."
            )
    with open(idx_path, "rb") as f:
        head = f.read(HEADER)
    if len(head) < HEADER or not head.startswith(MAGIC):
        raise ForgeError(
            f"{OPTION}.path: {idx_path} is not a Megatron index (it does not start with {MAGIC!r})."
        )
    version, code, sequences, documents = struct.unpack("<QBQQ", head[len(MAGIC) :])
    if version != VERSION:
        raise ForgeError(f"{OPTION}.path: {idx_path}: index version {version}, this reader knows {VERSION}.")
    if code not in DTYPES:
        raise ForgeError(f"{OPTION}.path: {idx_path}: unknown dtype code {code} (known: {sorted(DTYPES)}).")
    dtype = DTYPES[code]
    if dtype.startswith("float"):
        raise ForgeError(f"{OPTION}.path: {idx_path}: the tokens are {dtype}; token ids are integers.")
    size = os.path.getsize(idx_path)
    expected = HEADER + sequences * (4 + 8) + documents * 8
    if documents < 1 or size not in (expected, expected + sequences):
        raise ForgeError(
            f"{OPTION}.path: {idx_path}: {size} bytes, but its header ({sequences} sequences, "
            f"{documents} document indices) needs {expected}: the index is truncated or damaged."
        )
    bin_size = os.path.getsize(bin_path)
    if bin_size % ITEMSIZE[dtype]:
        raise ForgeError(
            f"{OPTION}.path: {bin_path}: {bin_size} bytes, not a whole number of {dtype} tokens."
        )
    return {"dtype": dtype, "sequences": sequences, "documents": documents - 1, "bin_size": bin_size}


class MegatronSource:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.bin_path, self.idx_path = pair(options.path)
        self.header = read_header(options.path)

    def describe(self) -> str:
        h = self.header
        return (
            f"megatron: {self.bin_path} ({h['documents']} documents, {h['sequences']} sequences, "
            f"{h['dtype']}{', EOD appended' if self.options.append_eod else ''})"
        )

    def _index(self) -> tuple[Any, Any, Any]:
        """``(tokens, document starts, document counts)`` from the index, checked."""
        import numpy as np

        h = self.header
        dtype = np.dtype(h["dtype"]).newbyteorder("<")
        n, d = h["sequences"], h["documents"] + 1
        index = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        lengths = np.frombuffer(index, "<i4", n, HEADER).astype(np.int64)
        pointers = np.frombuffer(index, "<i8", n, HEADER + 4 * n)
        doc_index = np.frombuffer(index, "<i8", d, HEADER + 12 * n)
        itemsize = dtype.itemsize
        ends = pointers + lengths * itemsize  # byte ends
        if n and (
            lengths.min() < 0
            or pointers[0] != 0
            or np.any(pointers[1:] != ends[:-1])
            or ends[-1] > h["bin_size"]
        ):
            raise ForgeError(
                f"{OPTION}.path: {self.idx_path}: its sequence pointers do not lay the sequences back "
                f"to back inside {self.bin_path} ({h['bin_size']} bytes): the index is damaged or not "
                "of this .bin."
            )
        if doc_index[0] != 0 or doc_index[-1] != n or np.any(np.diff(doc_index) < 0):
            raise ForgeError(
                f"{OPTION}.path: {self.idx_path}: its document indices do not run from 0 to the "
                f"{n} sequences in order: the index is damaged."
            )
        first = np.append(pointers // itemsize, int(ends[-1] // itemsize) if n else 0)
        starts = first[doc_index[:-1]]
        counts = first[doc_index[1:]] - starts
        total = int(first[-1])
        tokens = (
            np.memmap(self.bin_path, dtype=dtype, mode="r", shape=(total,)) if total else np.zeros(0, dtype)
        )
        return tokens, starts, counts

    def token_documents(self, eos_id: int) -> TokenDocuments:
        import numpy as np

        tokens, starts, counts = self._index()
        if self.options.append_eod:
            last = starts + counts - 1
            bad = np.flatnonzero((counts < 1) | (tokens[np.maximum(last, 0)] != eos_id))
            if len(bad):
                i = int(bad[0])
                found = "is empty" if counts[i] < 1 else f"ends with {int(tokens[last[i]])}"
                raise ForgeError(
                    f"{OPTION}.append_eod is true, but document {i} of {self.bin_path} {found}, not the "
                    f"tokenizer's EOS {eos_id} ({len(bad)} documents like it). Set append_eod: false, or "
                    "configure the tokenizer the data was made with."
                )
            counts = counts - 1
        return TokenDocuments(tokens, starts, counts, self.bin_path)

    def documents(self) -> Iterator[Any]:
        tokens, starts, counts = self._index()
        drop = 1 if self.options.append_eod else 0
        for start, count in zip(starts.tolist(), counts.tolist()):
            yield tokens[start : start + max(count - drop, 0)]
