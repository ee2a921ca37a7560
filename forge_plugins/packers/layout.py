"""Placing pieces of documents into padded rows: the part ``none`` and ``bfd`` share.

A *piece* is a contiguous run of one document's tokens (a whole document, or a chunk of
one longer than a row). Given where each piece goes (row and column), :func:`lay_out`
writes every output array with whole-array scatters. Labels follow one rule for every
packer: the label of a token is the next token of the same document; the last token of
a document (its EOS) and padding get -100.
"""

from __future__ import annotations

import numpy as np

IGNORE = -100


def join(documents: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The documents as one flat stream plus ``offsets`` (``len(documents) + 1``)."""
    lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    offsets = np.zeros(len(documents) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if len(documents) == 0:
        return np.zeros(0, np.int64), offsets
    return np.concatenate(documents), offsets


def shifted_labels(stream: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``labels[t] = stream[t + 1]``, or -100 where ``t`` is a document's last token."""
    labels = np.empty(stream.shape[0], np.int64)
    labels[:-1] = stream[1:]
    ends = offsets[1:][offsets[1:] > offsets[:-1]]  # skip empty documents
    labels[ends - 1] = IGNORE
    return labels


def lay_out(
    stream: np.ndarray,
    offsets: np.ndarray,
    piece_start: np.ndarray,
    piece_len: np.ndarray,
    piece_row: np.ndarray,
    piece_col: np.ndarray,
    *,
    rows: int,
    seq_len: int,
    pad_id: int,
    metadata: bool,
) -> dict[str, np.ndarray]:
    """Scatter pieces (stream ranges ``[start, start + len)``) to ``(row, col)``.

    Padding is ``pad_id`` with label -100. With ``metadata``, ``doc_ids`` numbers the
    pieces of a row from 0 in column order and gives the row's padding one more id (so
    no real token attends to padding), and ``positions`` count from 0 in every piece
    and in the padding.
    """
    S = seq_len
    labels_stream = shifted_labels(stream, offsets)
    total = int(piece_len.sum())
    first = np.zeros(len(piece_len), np.int64)
    np.cumsum(piece_len[:-1], out=first[1:])
    # within[t]: index of token t inside its piece (also its position).
    within = np.arange(total, dtype=np.int64) - np.repeat(first, piece_len)
    src = np.repeat(piece_start, piece_len) + within
    if total == stream.shape[0] and np.array_equal(piece_start, first):
        src = slice(None)  # the pieces tile the stream in order: no gather needed
    dest = np.repeat(piece_row * S + piece_col, piece_len) + within

    input_ids = np.full((rows, S), pad_id, np.int64)
    labels = np.full((rows, S), IGNORE, np.int64)
    input_ids.reshape(-1)[dest] = stream[src]
    labels.reshape(-1)[dest] = labels_stream[src]
    out = {"input_ids": input_ids, "labels": labels}
    if not metadata:
        return out

    # Slot of a piece within its row = its rank by column among the row's pieces.
    by_place = np.lexsort((piece_col, piece_row))
    row_sorted = piece_row[by_place]
    group_start = np.flatnonzero(np.r_[True, row_sorted[1:] != row_sorted[:-1]])
    group_len = np.diff(np.r_[group_start, len(by_place)])
    slot = np.empty(len(piece_len), np.int64)
    slot[by_place] = np.arange(len(by_place)) - np.repeat(group_start, group_len)
    pieces_in_row = np.bincount(piece_row, minlength=rows)
    fill = np.bincount(piece_row, weights=piece_len, minlength=rows).astype(np.int64)

    cols = np.arange(S, dtype=np.int64)
    doc_ids = np.repeat(pieces_in_row, S).reshape(rows, S)
    positions = cols[None, :] - fill[:, None]  # padding counts from 0 after the fill
    doc_ids.reshape(-1)[dest] = np.repeat(slot, piece_len)
    positions.reshape(-1)[dest] = within
    out["doc_ids"] = doc_ids
    out["positions"] = positions
    return out
