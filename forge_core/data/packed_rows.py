"""Packed rows read lazily: a :class:`~forge_core.api.RowLayout` over a
:class:`DocumentStream`, materialized one batch at a time.

:class:`DocumentStream` is the corpus as the packer sees it: documents back to back,
each followed by EOS, without that stream ever existing. It holds, per document, where
its tokens start in a token array (usually a memory map of a shard's ``tokens.bin``)
and how many there are; EOS is appended on the fly. :class:`PackedRows` reads rows:
for a batch of row indices it cuts the batch's pieces at the documents they cross
(runs: a few integers each), gathers the token ids of every row in one pass, and takes
labels, ``doc_ids`` and ``positions`` from those runs with whole-batch numpy (no loop
over rows or tokens). What it keeps in memory is
the layout (a few integers per piece, int32 while they fit) and the stream's offsets
(one int64 per document; where each starts in the tokens is a view of the shard's
memory-mapped offsets when every document is read, a copy for a subset).

With a trainable mask (``DocumentStream.trainable``: the tokens that take a loss, e.g.
a conversation's assistant tokens) the label at ``i`` is kept only when the token it
names (at ``i + 1``, or the next stream token at a piece's end) is trainable, else -100;
without one, nothing changes.

:func:`check_layout` is the kernel's check of what a packer returned, and
:func:`pack_documents` packs in-memory documents completely (tests and examples).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS, ForgeError, RowLayout


def restart_counts(starts: np.ndarray, size: int) -> np.ndarray:
    """``out[t] = t - (the last start <= t)``: a count from 0 that restarts at every
    entry of ``starts`` (sorted flat indices, the first one 0). One cumsum: an increment
    of 1 everywhere and, at each start, the jump back to 0."""
    out = np.ones(size, np.int64)
    if size:
        out[starts[1:]] = 1 - np.diff(starts)
        out[0] = 0
    return np.cumsum(out, out=out)


class DocumentStream:
    """Documents ``tokens[start[d] : start[d] + count[d]]``, each followed by ``eos_id``
    (or, with ``eos_id=None``, already ending with it), addressed as one stream.

    ``lengths`` (EOS included) and ``offsets`` (``len + 1`` entries) describe the
    stream; ``vocab_size``, when given, bounds every id read (an id outside it is an
    error naming ``where`` and the document: the file was damaged after it was
    written). ``trainable``, when given, is one flag per entry of ``tokens`` (nonzero:
    the token takes a loss); the EOS appended after a document is trainable iff the
    document's last token is (an assistant turn learns to stop; an empty document's
    EOS is trainable, as without a mask). Without it every token is trainable.
    ``inner``, when given, is per document the offset of an EOS stored inside it (-1:
    none): a preference pair, one unit to the packer and two documents to attention
    (the label at that EOS is -100 and a new document starts after it)."""

    def __init__(
        self,
        tokens: Any,
        start: np.ndarray,
        count: np.ndarray,
        eos_id: int | None,
        *,
        vocab_size: int | None = None,
        where: str = "the token stream",
        document_index: np.ndarray | None = None,
        trainable: Any = None,
        inner: np.ndarray | None = None,
    ) -> None:
        self.tokens = tokens
        self.trainable = trainable
        self.inner = None if inner is None else np.ascontiguousarray(inner, dtype=np.int64)
        # A view, not a copy, of int64 starts (a shard's memory-mapped offsets): per
        # document the stream keeps only ``offsets`` in memory, and derives the rest.
        self.start = np.ascontiguousarray(start, dtype=np.int64)
        count = np.asarray(count, dtype=np.int64)
        self.eos_id = eos_id
        self.vocab_size = vocab_size
        self.where = where
        self.document_index = document_index  # the shard's own numbers, for messages (None: 0, 1, ...)
        self.offsets = np.zeros(len(count) + 1, np.int64)
        np.cumsum(count, out=self.offsets[1:])
        if eos_id is not None:
            self.offsets += np.arange(len(self.offsets), dtype=np.int64)  # one EOS after each document
        self.eos_trainable = None
        if trainable is not None and eos_id is not None:
            last = self.start + count - 1
            self.eos_trainable = np.ones(len(count), bool)
            has = np.flatnonzero(count > 0)
            self.eos_trainable[has] = np.asarray(trainable[last[has]]) != 0

    @classmethod
    def from_documents(cls, documents: list[Any], trainable: list[Any] | None = None) -> DocumentStream:
        """In-memory documents that already end with EOS (what packers used to receive),
        with, optionally, one trainable mask per document (EOS included)."""
        arrays = [np.asarray(d).reshape(-1) for d in documents]
        count = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
        start = np.cumsum(count) - count
        flat = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
        mask = None
        if trainable is not None:
            masks = [np.asarray(m, bool).reshape(-1) for m in trainable]
            if [len(m) for m in masks] != count.tolist():
                raise ValueError("from_documents: one trainable flag per token of every document")
            mask = np.concatenate(masks).astype(np.uint8) if masks else np.zeros(0, np.uint8)
        return cls(flat, start, count, None, trainable=mask)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Every document's length in the stream, EOS included (computed: a new array each
        time, so a packer's layout() may change what it is given)."""
        return np.diff(self.offsets)

    @property
    def count(self) -> np.ndarray:
        """Every document's number of tokens in ``tokens`` (computed: a new array)."""
        return self.lengths - (0 if self.eos_id is None else 1)

    # A memory map travels to loader worker processes as its file, not its contents.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("tokens", "trainable"):
            t = state[key]
            if isinstance(t, np.memmap) and t.filename:
                state[key] = ("memmap", t.filename, t.dtype.str, t.shape, t.offset)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key in ("tokens", "trainable"):
            t = state.get(key)
            if isinstance(t, tuple) and t[0] == "memmap":
                # The offset: a .npy file's array starts after its header.
                state[key] = np.memmap(t[1], dtype=np.dtype(t[2]), mode="r", shape=t[3], offset=t[4])
        self.__dict__.update(state)

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def gather(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens at stream ``positions`` (int64) and whether each is its document's last."""
        doc = np.searchsorted(self.offsets, positions, side="right") - 1
        within = positions - self.offsets[doc]
        last = positions == self.offsets[doc + 1] - 1
        if self.eos_id is None:
            return np.asarray(self.tokens[self.start[doc] + within], dtype=np.int64), last
        out = np.full(len(positions), self.eos_id, np.int64)
        real = np.flatnonzero(~last)
        if real.size:
            ids = np.asarray(self.tokens[self.start[doc[real]] + within[real]], dtype=np.int64)
            if self.vocab_size is not None and ids.size and (ids.max() >= self.vocab_size or ids.min() < 0):
                bad = int(np.flatnonzero((ids >= self.vocab_size) | (ids < 0))[0])
                raise self.out_of_vocabulary(int(doc[real[bad]]), int(ids[bad]))
            out[real] = ids
        return out, last

    def trainable_at(self, positions: np.ndarray) -> np.ndarray:
        """Whether the tokens at stream ``positions`` take a loss (requires a mask)."""
        doc = np.searchsorted(self.offsets, positions, side="right") - 1
        within = positions - self.offsets[doc]
        out = np.empty(len(positions), bool)
        last = np.zeros(len(positions), bool)
        if self.eos_id is not None:  # the appended EOS has no flag of its own
            last = positions == self.offsets[doc + 1] - 1
            out[last] = self.eos_trainable[doc[last]]
        real = np.flatnonzero(~last)
        out[real] = np.asarray(self.trainable[self.start[doc[real]] + within[real]]) != 0
        return out

    def out_of_vocabulary(self, d: int, token: int) -> ForgeError:
        """The error for token id ``token`` of document ``d`` outside the vocabulary."""
        number = int(self.document_index[d]) if self.document_index is not None else d
        return ForgeError(
            f"{self.where}: document {number} holds token id {token}, outside the "
            f"tokenizer's vocabulary of {self.vocab_size} ids. The data is damaged or was made "
            "for another tokenizer: prepare it again."
        )


def layout_stats(layout: RowLayout, total: int) -> dict[str, float]:
    """``rows``, ``tokens`` (the stream's), ``kept`` (share of them that are inputs) and
    ``fill`` (share of row slots holding tokens), then the packer's own ``stats``."""
    placed = int(layout.lengths.sum())
    capacity = layout.rows * layout.seq_len
    stats: dict[str, float] = {
        "rows": layout.rows,
        "tokens": total,
        "kept": placed / total if total else 0.0,
        "fill": placed / capacity if capacity else 0.0,
    }
    stats.update({k: v for k, v in layout.stats.items() if k not in stats})
    return stats


def check_layout(layout: Any, stream: DocumentStream, seq_len: int, who: str) -> RowLayout:
    """What a packer's ``layout`` returned, checked against the contract: a
    :class:`ForgeError` naming ``who`` and the first problem otherwise."""

    def fail(problem: str) -> ForgeError:
        return ForgeError(f"{who}: layout() broke the packer contract: {problem}.")

    if not isinstance(layout, RowLayout):
        raise fail(f"it returned {type(layout).__name__}, not a RowLayout")
    if layout.seq_len != seq_len:
        raise fail(f"seq_len {layout.seq_len}, the run's data.seq_len is {seq_len}")
    n, ptr = layout.num_pieces, layout.row_ptr
    if len(layout.lengths) != n:
        raise fail(f"{n} starts but {len(layout.lengths)} lengths")
    if len(ptr) < 1 or ptr[0] != 0 or ptr[-1] != n or np.any(np.diff(ptr) < 0):
        raise fail("row_ptr must start at 0, never decrease and end at the number of pieces")
    if layout.metadata and layout.boundaries == "none":
        raise fail(
            "metadata needs boundaries 'documents' or 'eos' (labels that cross documents "
            "cannot come with document ids)"
        )
    if n == 0:
        return layout
    starts, lengths = layout.starts, layout.lengths
    if lengths.min() < 1:
        raise fail(f"piece {int(np.argmin(lengths))} is empty")
    if starts.min() < 0 or int((starts + lengths).max()) > stream.total:
        raise fail(f"a piece lies outside the stream of {stream.total} tokens")
    fill = np.add.reduceat(lengths, ptr[:-1][np.diff(ptr) > 0], dtype=np.int64)
    if fill.max() > seq_len:
        raise fail(f"a row holds {int(fill.max())} tokens, more than seq_len {seq_len}")
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], (starts + lengths)[order]
    if np.any(s[1:] < e[:-1]):
        j = int(np.flatnonzero(s[1:] < e[:-1])[0])
        raise fail(f"pieces overlap at stream position {int(s[j + 1])}: every token may be placed once")
    if layout.boundaries == "documents":
        doc = np.searchsorted(stream.offsets, starts, side="right") - 1
        crosses = starts + lengths > stream.offsets[doc + 1]
        if crosses.any():
            j = int(np.flatnonzero(crosses)[0])
            raise fail(
                f"piece {j} runs past the end of document {int(doc[j])}, but boundaries is "
                "'documents' (use 'eos' for windows across documents)"
            )
    return layout


class PackedRows:
    """The rows of a layout over a stream; :meth:`read` materializes some of them."""

    def __init__(self, layout: RowLayout, stream: DocumentStream, *, eos_id: int, pad_id: int) -> None:
        self.layout = layout
        self.stream = stream
        self.eos_id = int(eos_id)
        self.pad_id = int(pad_id)
        self.seq_len = layout.seq_len
        self.num_rows = layout.rows
        self.keys = (INPUT_IDS, LABELS) + ((DOC_IDS, POSITIONS) if layout.metadata else ())
        self.stats = layout_stats(layout, stream.total)
        self._count = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return self.num_rows

    def read(self, rows: Any) -> dict[str, np.ndarray]:
        """int64 arrays of shape ``(len(rows), seq_len)`` for the given row indices.

        Every step works on the batch's pieces (and the documents they touch), a few
        integers each; the per-token work is a handful of whole-batch passes: one repeat
        of source indices and one gather of token ids for every row at once, labels as
        the ids shifted by one, and, with metadata, one repeat each for ``doc_ids`` and
        ``positions`` over the document starts of the batch."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        L, S, stream = self.layout, self.seq_len, self.stream
        B = len(rows)
        N = B * S
        # The layout may store int32 (RowLayout's narrow storage): the batch's few
        # entries are widened once, so every sum below is exact.
        lo = L.row_ptr[rows].astype(np.int64, copy=False)
        counts = L.row_ptr[rows + 1] - lo
        first = np.zeros(B + 1, np.int64)
        np.cumsum(counts, out=first[1:])
        piece = np.repeat(lo - first[:-1], counts) + np.arange(first[-1], dtype=np.int64)
        pstart = L.starts[piece].astype(np.int64, copy=False)
        plen = L.lengths[piece].astype(np.int64, copy=False)
        pend = pstart + plen
        # Each piece's first slot in the flat (B * S) output: its row's, plus the pieces before it.
        pcum = np.zeros(len(piece) + 1, np.int64)
        np.cumsum(plen, out=pcum[1:])
        fill = pcum[first[1:]] - pcum[first[:-1]]
        pslot = np.repeat(np.arange(B, dtype=np.int64) * S - pcum[first[:-1]], counts) + pcum[:-1]

        # Segments: a piece cut at the documents it crosses (one per piece for 'documents').
        offsets = stream.offsets
        d0 = np.searchsorted(offsets, pstart, side="right") - 1
        nseg = np.searchsorted(offsets, pend - 1, side="right") - d0 if len(piece) else d0
        seg_piece = np.repeat(np.arange(len(piece), dtype=np.int64), nseg)
        doc = d0[seg_piece] + restart_counts(np.cumsum(nseg) - nseg, int(nseg.sum()))
        a = np.maximum(pstart[seg_piece], offsets[doc])
        b = np.minimum(pend[seg_piece], offsets[doc + 1])
        slot = pslot[seg_piece] + (a - pstart[seg_piece])
        ends_doc = b == offsets[doc + 1]  # the segment holds its document's last token
        eos_appended = stream.eos_id is not None
        real = b - a - (ends_doc if eos_appended else 0)  # tokens read from the array
        run = real > 0

        input_ids, index = self._gather_ids(
            slot[run], stream.start[doc[run]] + (a - offsets[doc])[run], real[run], doc[run], N
        )
        doc_last = slot[ends_doc] + (b - a)[ends_doc] - 1
        if eos_appended:
            input_ids[doc_last] = stream.eos_id
        padded = np.flatnonzero(fill < S)
        pad = None
        if padded.size:
            pad = np.arange(S) >= fill[:, None]
            np.copyto(input_ids.reshape(B, S), self.pad_id, where=pad)

        # A token's label is the next slot's id but at a piece's last slot, where it is
        # the next stream token (gathered, one per piece).
        labels = np.empty(N, np.int64)
        labels[:-1] = input_ids[1:]
        if len(piece):
            plast = pslot + plen - 1
            labels[plast] = stream.gather(np.minimum(pend, max(stream.total - 1, 0)))[0]
        if L.boundaries == "documents":
            labels[doc_last] = IGNORE_INDEX
        else:
            if len(piece):
                labels[plast[pend == stream.total]] = IGNORE_INDEX  # the stream's last token
            eos_slots = np.flatnonzero(input_ids == self.eos_id) if L.boundaries == "eos" else None
            if eos_slots is not None and pad is not None and self.pad_id == self.eos_id:
                eos_slots = eos_slots[~pad.reshape(-1)[eos_slots]]
            if eos_slots is not None:
                labels[eos_slots] = IGNORE_INDEX
        inner_slots = None
        if stream.inner is not None:
            at = offsets[doc] + stream.inner[doc]
            hit = (stream.inner[doc] >= 0) & (a <= at) & (at < b)
            inner_slots = slot[hit] + (at - a)[hit]
            labels[inner_slots] = IGNORE_INDEX  # its label would start the other document
        if stream.trainable is not None:
            # A label is kept only where the token it names takes a loss: the next slot's
            # token, or at a piece's last slot the next stream token.
            took = np.zeros(N, bool)
            if index is not None:
                took[:] = np.take(stream.trainable, index, mode="clip")
            if eos_appended:
                took[doc_last] = stream.eos_trainable[doc[ends_doc]]
            target = np.zeros(N, bool)
            target[:-1] = took[1:]
            if len(piece):
                target[plast] = stream.trainable_at(np.minimum(pend, max(stream.total - 1, 0)))
            labels[~target] = IGNORE_INDEX
        if pad is not None:
            np.copyto(labels.reshape(B, S), IGNORE_INDEX, where=pad)
        out = {INPUT_IDS: input_ids.reshape(B, S), LABELS: labels.reshape(B, S)}
        if L.metadata:
            # A document starts at every piece, at the padding, at every row and (for
            # 'eos') after an EOS.
            marks = [pslot, padded * S + fill[padded], np.arange(B, dtype=np.int64) * S]
            if L.boundaries == "eos":
                after = eos_slots + 1
                marks.append(after[after % S != 0])
            if inner_slots is not None:
                after = inner_slots + 1
                marks.append(after[after % S != 0])
            starts = np.sort(np.concatenate(marks))  # a few per row: sorting beats np.unique's hashing
            keep = np.ones(len(starts), bool)
            np.not_equal(starts[1:], starts[:-1], out=keep[1:])
            starts = starts[keep]
            # doc_ids: a start's rank among its row's starts, repeated over its run.
            rank = np.arange(len(starts), dtype=np.int64) - np.searchsorted(starts, starts - starts % S)
            span = np.append(starts[1:], N) - starts
            out[DOC_IDS] = np.repeat(rank, span).reshape(B, S)
            positions = np.repeat(-starts, span)
            positions += self._arange(N)
            out[POSITIONS] = positions.reshape(B, S)
        return out

    def _arange(self, size: int) -> np.ndarray:
        """``np.arange(size)``, kept between reads (every read of a batch size needs it twice)."""
        if len(self._count) < size:
            self._count = np.arange(size, dtype=np.int64)
        return self._count[:size]

    def _gather_ids(
        self, slot: np.ndarray, src: np.ndarray, length: np.ndarray, doc: np.ndarray, size: int
    ) -> np.ndarray:
        """``out[slot[k] + i] = tokens[src[k] + i]`` for ``i < length[k]``, in one gather:
        the source index of every slot is one repeat (a run's index counts on into the
        slots after it, clipped to the array, and those slots are overwritten by the
        caller). Ids outside the vocabulary are refused naming their document. Returns
        the ids and the source index of every slot (``None`` when no slot reads one),
        which the trainable mask is read through."""
        if not len(slot):
            return np.zeros(size, np.int64), None
        if slot[0] != 0:  # slots before the first run read token 0
            slot, src, length, doc = (np.concatenate([[0], x]) for x in (slot, src, length, doc))
            length[0], src[0] = 0, 0
        # Run k covers slots slot[k] to slot[k + 1] - 1 (the last to the end).
        span = np.empty(len(slot), np.int64)
        span[:-1] = slot[1:] - slot[:-1]
        span[-1] = size - slot[-1]
        index = np.repeat(src - slot, span)
        index += self._arange(size)
        out = np.asarray(np.take(self.stream.tokens, index, mode="clip"), dtype=np.int64)
        vocab = self.stream.vocab_size
        if vocab is not None and self.stream.eos_id is not None and (out.max() >= vocab or out.min() < 0):
            self._refuse_ids(out, slot, length, doc, vocab)
        return out, index

    def _refuse_ids(
        self, ids: np.ndarray, slot: np.ndarray, length: np.ndarray, doc: np.ndarray, vocab: int
    ) -> None:
        """Raise for the first id outside the vocabulary among the slots the runs fill
        (the slots between runs read tokens outside the documents and are overwritten)."""
        edge = np.zeros(len(ids) + 1, np.int64)
        np.add.at(edge, slot, 1)
        np.add.at(edge, slot + length, -1)
        bad = np.flatnonzero((np.cumsum(edge[:-1]) > 0) & ((ids >= vocab) | (ids < 0)))
        if bad.size:
            j = int(bad[0])
            raise self.stream.out_of_vocabulary(
                int(doc[np.searchsorted(slot, j, side="right") - 1]), int(ids[j])
            )


class ArrayRows:
    """Rows already in memory (a dict of ``(rows, seq_len)`` arrays): what tests hand
    the loader directly."""

    def __init__(self, arrays: dict[str, np.ndarray], stats: dict[str, float] | None = None) -> None:
        if not arrays or INPUT_IDS not in arrays:
            raise ForgeError(f"the loader needs packed rows with at least {INPUT_IDS!r}.")
        self.arrays = arrays
        self.num_rows = int(arrays[INPUT_IDS].shape[0])
        self.seq_len = int(arrays[INPUT_IDS].shape[1]) if arrays[INPUT_IDS].ndim == 2 else 0
        self.keys = tuple(arrays)
        self.stats = dict(stats or {})

    def __len__(self) -> int:
        return self.num_rows

    def read(self, rows: Any) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(v[rows], dtype=np.int64) for k, v in self.arrays.items()}


def pack_documents(
    packer: Any,
    documents: list[Any],
    *,
    seq_len: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
    trainable: list[Any] | None = None,
) -> dict[str, np.ndarray]:
    """Pack in-memory documents (EOS appended) completely: every row, every key, the
    packer's layout materialized exactly as a training run reads it. ``seq_len``,
    ``eos_id`` and ``pad_id`` default to the packer's attributes of those names;
    ``trainable``: one mask per document (EOS included), as the token cache stores it."""

    def given(value: int | None, name: str) -> int:
        if value is None:
            value = getattr(packer, name, None)
        if value is None:
            raise ValueError(
                f"pack_documents: pass {name}= (packer {type(packer).__name__} has no attribute {name!r})"
            )
        return int(value)

    stream = DocumentStream.from_documents(documents, trainable)
    who = f"packer {type(packer).__name__}"
    require_layout(packer, who)
    layout = check_layout(packer.layout(stream.lengths), stream, given(seq_len, "seq_len"), who)
    rows = PackedRows(layout, stream, eos_id=given(eos_id, "eos_id"), pad_id=given(pad_id, "pad_id"))
    return rows.read(np.arange(layout.rows))


def require_layout(packer: Any, who: str) -> None:
    """Refuse a packer without ``layout(lengths)``, naming the contract (an old
    ``pack(documents)`` packer is told what replaced it)."""
    if hasattr(packer, "layout"):
        return
    old = (
        " It has pack(documents), the eager contract of Forge's previews, which is gone."
        if hasattr(packer, "pack")
        else ""
    )
    raise ForgeError(
        f"{who} has no layout(lengths): it implements no packer contract.{old} Implement "
        "layout(lengths) -> RowLayout (forge_core.api.RowLayout, see docs/plugin-guide/packer.md)."
    )
