"""``greedy``: first-fit packing of whole documents into padded rows.

Semantics (what ``tests/test_greedy.py`` and Forge's conformance kit check):

- Documents arrive with EOS appended. A document longer than ``seq_len`` is first cut
  into ``seq_len``-token chunks (the last one shorter); every piece then goes, in
  document order, into the first row with room for it, or a new row. Nothing is
  dropped and every token is an input exactly once.
- ``labels[i]`` is the next token of the same document; a document's EOS and padding
  get -100, so no loss is taken across a document boundary. The last token of a chunk
  keeps its label (the first token of the next chunk, in whichever row that sits).
- ``doc_ids`` number the pieces of a row 0, 1, ... from the left; the padding after
  them gets one more id. ``positions`` restart at 0 in every piece and in the padding.

The placement is one Python loop over pieces with a numpy search for the first row
that fits; the tokens are written with slices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS


class GreedyPacker:
    def __init__(self, options: Any, *, seq_len: int, eos_id: int, pad_id: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.pad_id = pad_id

    def pack(self, documents: list[np.ndarray]) -> dict[str, np.ndarray]:
        S = self.seq_len
        pieces = []  # (document tokens, start, end): a chunk of one document
        for doc in documents:
            doc = np.asarray(doc, dtype=np.int64)
            pieces += [(doc, start, min(start + S, len(doc))) for start in range(0, len(doc), S)]
        placement, room = [], np.zeros(0, np.int64)
        for _, start, end in pieces:
            length = end - start
            fits = np.flatnonzero(room >= length)
            if fits.size:
                row = int(fits[0])
            else:
                row = len(room)
                room = np.append(room, S)
            placement.append((row, S - int(room[row])))
            room[row] -= length
        rows = len(room)
        input_ids = np.full((rows, S), self.pad_id, np.int64)
        labels = np.full((rows, S), IGNORE_INDEX, np.int64)
        doc_ids = np.zeros((rows, S), np.int64)
        positions = np.zeros((rows, S), np.int64)
        pieces_in_row = np.zeros(rows, np.int64)
        for (doc, start, end), (row, col) in zip(pieces, placement):
            length = end - start
            input_ids[row, col : col + length] = doc[start:end]
            # The next token of the document: within the piece, or the next chunk's first.
            labels[row, col : col + length] = np.append(doc[start + 1 : end + 1], IGNORE_INDEX)[:length]
            doc_ids[row, col : col + length] = pieces_in_row[row]
            positions[row, col : col + length] = np.arange(length)
            pieces_in_row[row] += 1
        # Padding: its own document after the pieces, positions from 0.
        fill = S - room
        for row in np.flatnonzero(room):
            doc_ids[row, fill[row] :] = pieces_in_row[row]
            positions[row, fill[row] :] = np.arange(room[row])
        return {INPUT_IDS: input_ids, LABELS: labels, DOC_IDS: doc_ids, POSITIONS: positions}
