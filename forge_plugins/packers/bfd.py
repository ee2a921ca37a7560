"""The ``bfd`` packer: best-fit-decreasing bin packing of whole documents into rows.

Semantics (pinned by ``tests/test_packers.py``):

- A document of ``L`` tokens (EOS included) occupies ``L`` input positions; a row holds
  ``seq_len`` of them. No ``+1`` is reserved: the label of a document's last token (its
  EOS) is -100 anyway, so a document needs no token beyond itself.
- Only a document longer than ``seq_len`` is split: into consecutive chunks of
  ``seq_len`` tokens, in order, each filling a row of its own, plus the remainder, which
  is packed like any other piece. The label of a chunk's last token is the next token
  of the document (the first of the next chunk); every token appears exactly once.
- Pieces are sorted by length, longest first (ties in document order), and each goes
  into the open row with the least room that still fits it, or a new row. Within a row
  pieces sit left to right in placement order; the rest is ``pad_id`` with label -100.
- ``doc_ids`` number a row's pieces 0, 1, ...; padding gets the next id, so no real
  token attends to it. ``positions`` restart at 0 in every piece (a chunk of a long
  document starts at 0 too) and in the padding.
- In the log: ``fill`` = document tokens / (rows x seq_len); ``kept`` = 1.0 (nothing
  is dropped); ``rows``, ``tokens``, ``split_documents``.

The placement is a single pass over the pieces in Python, but each step is a few
big-int operations on a ``seq_len + 1``-bit mask: rows are kept in buckets by remaining
room, and the mask of non-empty buckets finds the fullest row that fits (its lowest
set bit at or above the piece length). Everything else is whole-array numpy, and it
reads only the documents' lengths: the kernel materializes rows as they are read.
"""

from __future__ import annotations

import numpy as np

from forge_core.api import RowLayout
from forge_plugins.packers.layout import RowPacker


class BfdPacker(RowPacker):
    def layout(self, lengths: np.ndarray) -> RowLayout:
        S = self.seq_len
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        piece_start, piece_len = split_documents(offsets, S)
        piece_row, piece_col, rows = place(piece_len, S)
        return RowLayout.from_placement(
            S,
            piece_start,
            piece_len,
            piece_row,
            piece_col,
            rows=rows,
            boundaries="documents",
            metadata=True,
            stats={"split_documents": int((np.asarray(lengths) > S).sum())},
        )


def split_documents(offsets: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Pieces (stream start, length) in stream order: documents up to ``seq_len`` whole,
    longer ones as consecutive ``seq_len`` chunks plus the remainder. Empty documents
    give no piece."""
    lengths = np.diff(offsets)
    n_pieces = -(-lengths // seq_len)  # ceil; 0 for an empty document
    doc = np.repeat(np.arange(len(lengths)), n_pieces)
    first = np.zeros(len(lengths), np.int64)
    np.cumsum(n_pieces[:-1], out=first[1:])
    chunk = np.arange(len(doc), dtype=np.int64) - np.repeat(first, n_pieces)
    start = offsets[:-1][doc] + chunk * seq_len
    length = np.minimum(seq_len, lengths[doc] - chunk * seq_len)
    return start, length


def place(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-fit decreasing: ``(row, column, rows)`` for every piece (all ``<= capacity``).

    ``buckets[c]`` holds the open rows with exactly ``c`` free slots, and bit ``c`` of
    ``mask`` is set while that bucket is non-empty, so the best fit for a piece of
    length ``l`` is the lowest set bit of ``mask >> l``.
    """
    n = len(lengths)
    order = np.argsort(-lengths, kind="stable")
    sorted_len = lengths[order].tolist()
    smallest = sorted_len[-1] if n else 0
    buckets: list[list[int]] = [[] for _ in range(capacity + 1)]
    mask = 0
    rows = 0
    row_of = [0] * n
    col_of = [0] * n
    for j, length in enumerate(sorted_len):
        fits = mask >> length
        if fits:
            room = length + (fits & -fits).bit_length() - 1
            bucket = buckets[room]
            row = bucket.pop()
            if not bucket:
                mask ^= 1 << room
        else:
            row = rows
            rows += 1
            room = capacity
        row_of[j] = row
        col_of[j] = capacity - room
        left = room - length
        # Items only get shorter: a row with less room than the shortest piece is done.
        if left >= smallest and left:
            bucket = buckets[left]
            if not bucket:
                mask |= 1 << left
            bucket.append(row)
    piece_row = np.empty(n, np.int64)
    piece_col = np.empty(n, np.int64)
    piece_row[order] = row_of
    piece_col[order] = col_of
    return piece_row, piece_col, rows
