"""The ``concat`` packer: documents joined end to end and cut into fixed windows.

Exact semantics (pinned by ``tests/test_packers.py``):

- The documents (each already ending with EOS) are joined into one stream of ``N``
  tokens. Row ``k`` is the window ``w = stream[k*S : k*S + S + 1]`` (``S = seq_len``,
  stride ``S``): ``input_ids = w[:-1]``, ``labels = w[1:]``. So every stream token is an
  input exactly once and the label of a row's last position is the first input of the
  next row.
- The last partial window (fewer than ``S + 1`` tokens left) is dropped; at most ``S``
  tokens are lost. The log's ``kept`` reports the share of tokens that are inputs.
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

The layout is ``RowLayout.windows`` with boundaries ``"eos"`` (isolating) or
``"none"``: the kernel computes labels, ``doc_ids`` (one ``np.cumsum`` over the shifted
EOS mask of each row it reads) and ``positions`` when a batch is read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge_core.api import RowLayout
from forge_plugins.packers.layout import RowPacker


class ConcatPacker(RowPacker):
    def __init__(self, options: Any, *, seq_len: int, eos_id: int, pad_id: int) -> None:
        super().__init__(options, seq_len=seq_len, eos_id=eos_id, pad_id=pad_id)
        self.isolate = bool(getattr(options, "isolate", True))

    def layout(self, lengths: np.ndarray) -> RowLayout:
        total = int(np.sum(lengths))
        rows = max(total - 1, 0) // self.seq_len
        return RowLayout.windows(
            self.seq_len, rows, boundaries="eos" if self.isolate else "none", metadata=self.isolate
        )
