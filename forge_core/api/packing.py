"""What a packer computes: a :class:`RowLayout`, where every piece of the corpus goes.

A packer no longer builds rows. It is given the length of every document (EOS
included) and returns a small index: which runs of the *document stream* (every
document back to back, each ending with its EOS) go into which row, from column 0,
left to right. The kernel keeps that index (a few integers per document, not per
token) and materializes a batch's ``input_ids``, ``labels`` and, when the layout says
so, ``doc_ids`` and ``positions`` only when the batch is read, from memory-mapped
tokens (:mod:`forge_core.data.packed_rows`). So resident memory grows with the number
of documents, not with the number of tokens, and a third-party packer is lazy as soon
as it implements :meth:`LazyPacker.layout`.

How labels and metadata follow from the layout (``boundaries``):

- ``"documents"``: every piece lies inside one document. A token's label is the next
  token of its document, wherever that sits (so cutting a long document into pieces
  loses no target), and -100 on a document's last token (its EOS) and on padding.
  With ``metadata``: ``doc_ids`` number the pieces of a row 0, 1, ... from the left,
  padding gets one more; ``positions`` restart at 0 in every piece and in the padding.
- ``"eos"``: a piece may run across documents (a window of the stream). A token's
  label is the next stream token, -100 where the token itself is EOS (its label would
  start the next document) and on padding. With ``metadata``: a new document starts at
  every piece start, after every EOS and at the padding; ``doc_ids`` count those starts
  (from 0), ``positions`` restart at each.
- ``"none"``: the label is the next stream token (across documents), -100 on padding;
  no metadata.

This module imports neither torch nor (until a layout is built) numpy; plugin authors
import its names from :mod:`forge_core.api`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import attrs

#: How labels and metadata follow from a :class:`RowLayout` (see this module's docstring).
Boundaries = Literal["documents", "eos", "none"]
#: Every value of :data:`Boundaries`, in the order the docs list them.
BOUNDARIES: tuple[str, ...] = ("documents", "eos", "none")


#: A layout array is stored as int32 when every entry lies in ``[-NARROW, NARROW)``: the
#: sum or difference of two entries (``starts + lengths``, ``np.diff(row_ptr)``) then
#: still fits in int32, and a corpus of up to a billion tokens costs half the memory.
NARROW = 1 << 30


def _int64(value: Any) -> Any:
    import numpy as np

    array = np.asarray(value)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError(f"expected a 1-D integer array, got shape {array.shape} of {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _index(value: Any) -> Any:
    """A layout array in its storage dtype: int32 within ``±NARROW``, else int64."""
    import numpy as np

    array = _int64(value)
    if not array.size or (int(array.min()) >= -NARROW and int(array.max()) < NARROW):
        return array.astype(np.int32)
    return array


@attrs.frozen(eq=False)
class RowLayout:
    """Pieces of the document stream placed into rows of ``seq_len`` tokens.

    Pieces are stored row by row, each row's from column 0 without gaps:
    ``starts[j]`` and ``lengths[j]`` are piece ``j``'s first stream position and its
    number of tokens; row ``r`` holds pieces ``row_ptr[r]`` to ``row_ptr[r + 1] - 1``
    in column order; what a row's pieces leave free is padding (``pad_id``, label
    -100). ``boundaries`` and ``metadata`` say how labels, ``doc_ids`` and
    ``positions`` follow (:mod:`forge_core.api.packing`; the packer chapter of the
    plugin guide); ``stats`` are extra numbers for the log (the kernel computes
    ``rows``, ``tokens``, ``kept`` and ``fill`` itself).

    The three arrays are kept for the whole run, a few per row, so each is stored in
    the narrowest of int32 and int64 that holds it: int32 while every entry lies within
    ``±2**30`` (:data:`NARROW`; any sum or difference of two entries then still fits),
    else int64. They accept any 1-D integer input; a reader that multiplies them, or
    adds more than two, casts first (``np.asarray(layout.starts, np.int64)``).

    Build one with :meth:`from_placement` (a row and column per piece, any order) or
    :meth:`windows` (fixed windows of the stream, as ``concat`` does).
    """

    seq_len: int
    starts: Any = attrs.field(converter=_index)
    lengths: Any = attrs.field(converter=_index)
    row_ptr: Any = attrs.field(converter=_index)
    boundaries: Boundaries = attrs.field(default="documents", validator=attrs.validators.in_(BOUNDARIES))
    metadata: bool = False
    stats: dict[str, float] = attrs.field(factory=dict)

    @property
    def rows(self) -> int:
        return len(self.row_ptr) - 1

    @property
    def num_pieces(self) -> int:
        return len(self.starts)

    @classmethod
    def from_placement(
        cls,
        seq_len: int,
        starts: Any,
        lengths: Any,
        rows_of: Any,
        cols_of: Any,
        *,
        rows: int | None = None,
        boundaries: Boundaries = "documents",
        metadata: bool = False,
        stats: dict[str, float] | None = None,
    ) -> RowLayout:
        """A layout from a row and column per piece (pieces in any order). ``rows``
        defaults to one more than the highest row used; rows without a piece are all
        padding. Pieces of a row must cover it from column 0 without gaps or overlaps:
        a ``ValueError`` says where they do not."""
        import numpy as np

        starts, lengths, rows_of, cols_of = (_int64(a) for a in (starts, lengths, rows_of, cols_of))
        if not len(starts) == len(lengths) == len(rows_of) == len(cols_of):
            raise ValueError("starts, lengths, rows_of and cols_of must have one entry per piece")
        n_rows = int(rows_of.max()) + 1 if rows is None and len(rows_of) else int(rows or 0)
        if len(rows_of) and (rows_of.min() < 0 or rows_of.max() >= n_rows):
            raise ValueError(f"piece rows must lie in [0, {n_rows})")
        order = np.lexsort((cols_of, rows_of))
        rows_sorted, cols_sorted, lengths_sorted = rows_of[order], cols_of[order], lengths[order]
        row_ptr = np.zeros(n_rows + 1, np.int64)
        np.cumsum(np.bincount(rows_sorted, minlength=n_rows), out=row_ptr[1:])
        # Each piece must start where the previous piece of its row ended (column 0 first).
        within = np.cumsum(lengths_sorted) - lengths_sorted
        counts = np.diff(row_ptr)
        used = counts > 0
        expected = within - np.repeat(within[row_ptr[:-1][used]], counts[used])
        bad = np.flatnonzero(cols_sorted != expected)
        if bad.size:
            j = int(bad[0])
            raise ValueError(
                f"row {int(rows_sorted[j])}: a piece at column {int(cols_sorted[j])} where the row's "
                f"pieces so far end at column {int(expected[j])}; pieces must fill a row from column 0 "
                "without gaps or overlaps"
            )
        return cls(
            seq_len,
            starts[order],
            lengths_sorted,
            row_ptr,
            boundaries=boundaries,
            metadata=metadata,
            stats=dict(stats or {}),
        )

    @classmethod
    def windows(
        cls,
        seq_len: int,
        rows: int,
        *,
        boundaries: Boundaries = "eos",
        metadata: bool = False,
        stats: dict[str, float] | None = None,
    ) -> RowLayout:
        """Row ``k`` is the stream window ``[k * seq_len, (k + 1) * seq_len)``."""
        import numpy as np

        return cls(
            seq_len,
            np.arange(rows, dtype=np.int64) * seq_len,
            np.full(rows, seq_len, np.int64),
            np.arange(rows + 1, dtype=np.int64),
            boundaries=boundaries,
            metadata=metadata,
            stats=dict(stats or {}),
        )


@runtime_checkable
class LazyPacker(Protocol):
    """The packer contract. The implementation named by a
    :class:`~forge_core.api.PackerSpec` is constructed as
    ``cls(options, seq_len=..., eos_id=..., pad_id=...)`` and implements ``layout``.

    ``layout(lengths)`` receives the length of every document in stream order (a 1-D
    int64 array, EOS included, every entry at least 1) and returns a
    :class:`RowLayout` of ``seq_len``; it reads no token. ``metadata`` must be true
    exactly when the spec declares (under these options) that the packer emits
    ``doc_ids`` and ``positions``."""

    def layout(self, lengths: Any) -> RowLayout: ...
