"""``greedy``: first-fit packing of whole documents into padded rows.

Semantics (what ``tests/test_greedy.py`` and Forge's conformance kit check):

- Documents arrive as their lengths (EOS included). A document longer than
  ``seq_len`` is first cut into ``seq_len``-token chunks (the last one shorter); every
  piece then goes, in document order, into the first row with room for it, or a new
  row. Nothing is dropped and every token is an input exactly once.
- The layout's boundaries are ``"documents"`` with metadata, so Forge gives the rows
  ``labels`` that never cross a document (-100 on a document's EOS and on padding; the
  last token of a chunk keeps its label, the first token of the next chunk), ``doc_ids``
  numbering the pieces of a row 0, 1, ... from the left (padding gets one more) and
  ``positions`` restarting at 0 in every piece and in the padding.

The placement is one Python loop over pieces with a numpy search for the first row
that fits. It reads no token: Forge materializes a row's tokens when a batch is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import RowLayout


class GreedyPacker:
    def __init__(self, options: Any, *, seq_len: int, eos_id: int, pad_id: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.pad_id = pad_id

    def layout(self, lengths: np.ndarray) -> RowLayout:
        S = self.seq_len
        starts, sizes, rows, cols = [], [], [], []
        room = np.zeros(0, np.int64)  # free slots of every open row
        offset = 0
        for length in lengths.tolist():
            for start in range(0, length, S):  # chunks of a long document, in order
                size = min(S, length - start)
                fits = np.flatnonzero(room >= size)
                if fits.size:
                    row = int(fits[0])
                else:
                    row = len(room)
                    room = np.append(room, S)
                starts.append(offset + start)
                sizes.append(size)
                rows.append(row)
                cols.append(S - int(room[row]))
                room[row] -= size
            offset += length
        return RowLayout.from_placement(
            S, starts, sizes, rows, cols, rows=len(room), boundaries="documents", metadata=True
        )
