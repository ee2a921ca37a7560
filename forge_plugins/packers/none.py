"""The ``none`` packer: one document per row.

Row ``d`` holds document ``d``'s first ``seq_len`` tokens (a longer document is
truncated: ``stats["kept"]`` says how much survived), then ``pad_id``. ``labels[i]`` is
the next token of the same document (so the last kept token of a truncated document
still has a label), -100 on the document's EOS and on padding. Rows need no
``doc_ids``: each holds one document and positions are the column.
"""

from __future__ import annotations

import numpy as np

from forge_plugins.packers.layout import RowPacker, join, lay_out


class NonePacker(RowPacker):

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
