"""What the built-in packers share: their constructor (the hook contract's signature).

Each built-in computes only a :class:`~forge_core.api.RowLayout`
from the documents' lengths; the kernel materializes rows from it when a batch is read
(:mod:`forge_core.data.packed_rows`).
"""

from __future__ import annotations

from typing import Any


class RowPacker:
    """What every built-in packer is constructed with."""

    def __init__(self, options: Any, *, seq_len: int, eos_id: int, pad_id: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be at least 1, got {seq_len}")
        self.options = options
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.pad_id = pad_id
