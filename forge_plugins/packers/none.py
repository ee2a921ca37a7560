"""The ``none`` packer: one document per row.

Row ``d`` holds document ``d``'s first ``seq_len`` tokens (a longer document is
truncated: the log's ``kept`` says how much survived), then ``pad_id``. ``labels[i]``
is the next token of the same document (so the last kept token of a truncated document
still has a label), -100 on the document's EOS and on padding. Rows need no
``doc_ids``: each holds one document and positions are the column.
"""

from __future__ import annotations

import numpy as np

from forge_core.api import RowLayout
from forge_plugins.packers.layout import RowPacker


class NonePacker(RowPacker):
    def layout(self, lengths: np.ndarray) -> RowLayout:
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        rows = len(lengths)
        return RowLayout(
            self.seq_len,
            offsets[:-1],
            np.minimum(lengths, self.seq_len),
            np.arange(rows + 1, dtype=np.int64),
            boundaries="documents",
        )
