"""The ``concat`` packer: documents joined end to end and cut into fixed windows.

Exact semantics (pinned by ``tests/test_packers.py``):

- The documents (each already ending with EOS) are joined into one stream of ``N``
  tokens. Row ``k`` is the window ``w = stream[k*S : k*S + S + 1]`` (``S = seq_len``,
  stride ``S``): ``input_ids = w[:-1]``, ``labels = w[1:]``. So every stream token is an
  input exactly once and the label of a row's last position is the first input of the
  next row.
- The last partial window (fewer than ``S + 1`` tokens left) is dropped; at most ``S``
  tokens are lost. ``stats["kept"]`` reports the share of tokens that are inputs.
- With ``isolate`` (the default):

  - ``doc_ids[i]`` is the number of EOS tokens among ``input_ids[:i]`` (strictly before
    ``i``): an EOS belongs to the document it ends. Computed with one ``np.cumsum`` over
    the EOS mask shifted right by one.
  - ``labels[i] = -100`` where ``input_ids[i]`` is EOS: its label would be the first
    token of the next document. The last token of a document still predicts its EOS.
  - ``positions[i]`` counts from 0 at every document start, and at column 0: a row that
    starts in the middle of a document sees that fragment as its own document, with
    positions from 0, consistent with its ``doc_ids``.

- With ``isolate: false`` labels are the plain shifted tokens and neither ``doc_ids``
  nor ``positions`` is emitted.

Everything is whole-array numpy; there is no per-token Python loop on this path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS
from forge_plugins.packers.layout import RowPacker, join, restart_counts


class ConcatPacker(RowPacker):
    def __init__(self, options: Any, *, seq_len: int, eos_id: int, pad_id: int) -> None:
        super().__init__(options, seq_len=seq_len, eos_id=eos_id, pad_id=pad_id)
        self.isolate = bool(getattr(options, "isolate", True))

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

