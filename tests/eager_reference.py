"""The eager packers as they were before rows became lazy: ``pack(documents)`` building
every ``(rows, seq_len)`` array at once. Kept verbatim (placement aside, which
``bfd`` still shares) as the reference that the lazy rows are proven equal to, bit for
bit (tests/test_lazy_rows.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS
from forge_plugins.packers.bfd import place, split_documents


def join(documents: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The documents as one flat stream plus ``offsets`` (``len(documents) + 1``)."""
    lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    offsets = np.zeros(len(documents) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if len(documents) == 0:
        return np.zeros(0, np.int64), offsets
    return np.concatenate(documents), offsets


def shifted_labels(stream: np.ndarray, offsets: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``labels[t] = stream[t + 1]``, or -100 where ``t`` is a document's last token
    (written into the first ``len(stream)`` entries of ``out`` when given)."""
    total = stream.shape[0]
    labels = np.empty(total, np.int64) if out is None else out
    labels[: total - 1] = stream[1:]
    ends = offsets[1:][offsets[1:] > offsets[:-1]]  # skip empty documents
    labels[ends - 1] = IGNORE_INDEX
    return labels


def restart_counts(starts: np.ndarray, size: int) -> np.ndarray:
    """``out[t] = t - (the last start <= t)``: a count from 0 that restarts at every
    entry of ``starts`` (sorted flat indices, the first one 0).

    An increment of 1 everywhere and, at each start, the jump back to 0; one cumsum.
    (Cheaper than arange minus a repeat, or a running ``np.maximum.accumulate`` of the
    starts: one fresh array instead of three.)
    """
    out = np.ones(size, np.int64)
    if size:
        # At start j after a segment that began at p, the previous count was j-1-p.
        out[starts[1:]] = 1 - np.diff(starts)
        out[0] = 0
    return np.cumsum(out, out=out)


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
    """Rows made of pieces (stream ranges ``[start, start + len)``) at ``(row, col)``.

    Pieces of a row must sit left to right without gaps from column 0; the rest of the
    row is padding: ``pad_id`` with label -100. With ``metadata``, ``doc_ids`` numbers
    the pieces of a row from 0 in column order and gives the row's padding one more id
    (so no real token attends to padding), and ``positions`` count from 0 in every
    piece and in the padding.

    The output is built in its own order, as *segments*: each row's pieces, then its
    padding. One flat ``within`` (index inside the segment) gives the positions and,
    offset by each segment's source, the gather index into the stream; padding
    gathers a sentinel appended after the stream.
    """
    S = seq_len
    n_pieces = len(piece_len)
    total = int(stream.shape[0])
    # Pieces in output order: by row, then column.
    order = np.argsort(piece_row * S + piece_col, kind="stable")
    per_row = np.bincount(piece_row, minlength=rows)
    fill = np.bincount(piece_row, weights=piece_len, minlength=rows).astype(np.int64)
    before = np.zeros(rows + 1, np.int64)  # pieces in earlier rows
    np.cumsum(per_row, out=before[1:])
    row_sorted = piece_row[order]
    # Segment k of the output: row r's pieces land after r padding segments.
    piece_seg = np.arange(n_pieces, dtype=np.int64) + row_sorted
    pad_seg = before[1:] + np.arange(rows, dtype=np.int64)
    n_seg = n_pieces + rows
    seg_len = np.empty(n_seg, np.int64)
    seg_src = np.empty(n_seg, np.int64)
    seg_len[piece_seg] = piece_len[order]
    seg_src[piece_seg] = piece_start[order]
    seg_len[pad_seg] = S - fill
    seg_src[pad_seg] = total  # the sentinel
    seg_start = np.zeros(n_seg, np.int64)
    np.cumsum(seg_len[:-1], out=seg_start[1:])
    if not np.array_equal(seg_start[piece_seg], row_sorted * S + piece_col[order]):
        raise ValueError("pieces must fill each row from column 0 without gaps or overlaps")

    # within[t]: index of output slot t inside its segment (the positions).
    within = restart_counts(seg_start[seg_len > 0], rows * S)
    src = np.repeat(seg_src, seg_len)
    src += within
    np.minimum(src, total, out=src)  # padding: every index at or past the sentinel
    tokens = np.empty(total + 1, np.int64)
    tokens[:total] = stream
    tokens[total] = pad_id
    labels = np.empty(total + 1, np.int64)
    shifted_labels(stream, offsets, out=labels)
    labels[total] = IGNORE_INDEX
    out = {
        INPUT_IDS: tokens[src].reshape(rows, S),
        LABELS: labels[src].reshape(rows, S),
    }
    if metadata:
        seg_slot = np.empty(n_seg, np.int64)
        seg_slot[piece_seg] = np.arange(n_pieces, dtype=np.int64) - before[row_sorted]
        seg_slot[pad_seg] = per_row
        out[DOC_IDS] = np.repeat(seg_slot, seg_len).reshape(rows, S)
        out[POSITIONS] = within.reshape(rows, S)
    return out


class _Base:
    def __init__(self, seq_len: int, eos_id: int, pad_id: int, isolate: bool = True) -> None:
        self.seq_len, self.eos_id, self.pad_id, self.isolate = seq_len, eos_id, pad_id, isolate
        self.stats: dict[str, Any] = {}


class EagerConcat(_Base):
    def pack(self, documents: list[np.ndarray]) -> dict[str, np.ndarray]:
        return self.pack_stream(join(documents)[0])

    def pack_stream(self, stream: np.ndarray) -> dict[str, np.ndarray]:
        """Pack an already joined 1-D token stream (what :meth:`pack` does after joining)."""
        S = self.seq_len
        if stream.dtype.kind not in "iu" or stream.dtype == np.uint64:
            stream = stream.astype(np.int64)  # uint64 would mix with -100 into float64
        total = int(stream.shape[0])
        rows = max(total - 1, 0) // S
        # Inputs and labels are two overlapping views of the stream, shifted by one; no
        # window is ever materialized.
        inputs = stream[: rows * S].reshape(rows, S)
        targets = stream[1 : rows * S + 1].reshape(rows, S)
        self.stats = {
            "rows": rows,
            "tokens": total,
            "kept": (rows * S / total) if total else 0.0,
            "fill": 1.0 if rows else 0.0,
        }
        input_ids = inputs.astype(np.int64)
        if not self.isolate:
            return {INPUT_IDS: input_ids, LABELS: targets.astype(np.int64)}

        # Compare in the stream's own dtype (often int32 or uint16): less memory to read.
        eos = inputs == self.eos_id
        labels = targets.astype(np.int64)
        np.copyto(labels, IGNORE_INDEX, where=eos)  # twice as fast as np.where here
        out = {INPUT_IDS: input_ids, LABELS: labels}
        # The EOS mask shifted right by one: its cumsum counts EOS strictly before i.
        shifted = np.empty_like(eos)
        shifted[:, 0] = False
        shifted[:, 1:] = eos[:, :-1]
        out[DOC_IDS] = np.cumsum(shifted, axis=1, dtype=np.int64)
        # The same mask with column 0 set marks every document start in the row.
        shifted[:, 0] = True
        out[POSITIONS] = restart_counts(np.flatnonzero(shifted), shifted.size).reshape(rows, S)
        return out


class EagerNone(_Base):
    def pack(self, documents: list[np.ndarray]) -> dict[str, np.ndarray]:
        S = self.seq_len
        stream, offsets = join(documents)
        rows = len(documents)
        lengths = np.diff(offsets)
        kept = np.minimum(lengths, S)
        out = lay_out(
            stream,
            offsets,
            offsets[:-1],
            kept,
            np.arange(rows, dtype=np.int64),
            np.zeros(rows, np.int64),
            rows=rows,
            seq_len=S,
            pad_id=self.pad_id,
            metadata=False,
        )
        total = int(lengths.sum())
        self.stats = {
            "rows": rows,
            "tokens": total,
            "kept": float(kept.sum() / total) if total else 0.0,
            "fill": float(kept.sum() / (rows * S)) if rows else 0.0,
        }
        return out


class EagerBfd(_Base):
    def pack(self, documents: list[np.ndarray]) -> dict[str, np.ndarray]:
        S = self.seq_len
        stream, offsets = join(documents)
        piece_start, piece_len = split_documents(offsets, S)
        piece_row, piece_col, rows = place(piece_len, S)
        out = lay_out(
            stream,
            offsets,
            piece_start,
            piece_len,
            piece_row,
            piece_col,
            rows=rows,
            seq_len=S,
            pad_id=self.pad_id,
            metadata=True,
        )
        total = int(stream.shape[0])
        self.stats = {
            "rows": rows,
            "tokens": total,
            "kept": 1.0 if total else 0.0,
            "fill": total / (rows * S) if rows else 0.0,
            "split_documents": int((np.diff(offsets) > S).sum()),
        }
        return out
