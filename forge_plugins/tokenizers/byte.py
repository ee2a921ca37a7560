"""The ``byte`` tokenizer: a document's UTF-8 bytes are its token ids.

Ids 0-255 are bytes, 256 is EOS, 257 is PAD; ``vocab_size`` is 258. It needs no file,
so ``save`` writes nothing. ``decode`` skips EOS and PAD and replaces byte sequences
that are not valid UTF-8 (a window may cut a character in half).
"""

from __future__ import annotations

from typing import Any

import numpy as np

EOS = 256
PAD = 257


class ByteTokenizer:
    vocab_size = 258
    eos_id = EOS
    pad_id = PAD
    identity = "byte:utf-8:eos=256:pad=257"

    def __init__(self, options: Any = None) -> None:
        pass

    @classmethod
    def load(cls, directory: str) -> ByteTokenizer:
        """The tokenizer ``save`` wrote to ``directory`` (it needs nothing from it)."""
        return cls()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # np.frombuffer avoids a Python int per byte: tens of MB/s instead of a few.
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Any) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def save(self, directory: str) -> None:
        """Nothing to save: the byte tokenizer is fully described by its identity."""
