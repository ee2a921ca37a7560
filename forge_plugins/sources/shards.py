"""The ``shards`` source: documents pre-tokenized by ``forge-run prepare``.

It yields token arrays (memory-mapped, no EOS; the pipeline appends EOS) and exposes
``tokenizer_identity``: the pipeline refuses to combine these shards with a tokenizer
whose ``identity`` differs, and checks every id against that tokenizer's vocabulary.
The format is :mod:`forge_core.api.shards`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from forge_core.api import ForgeError
from forge_core.api.unstable import Shards


class ShardSource:
    def __init__(self, options: Any) -> None:
        if not options.path:
            raise ForgeError(
                "data.source_options.path is empty: give the directory written by `forge-run prepare`."
            )
        self.shards = Shards(options.path)
        self.tokenizer_identity: str = self.shards.tokenizer["identity"]

    def describe(self) -> str:
        s = self.shards
        return (
            f"shards: {s.path}, {s.num_documents} documents, {s.num_tokens} tokens "
            f"({s.dtype.name}), tokenizer {self.tokenizer_identity}, from {s.index.get('source', '?')}"
        )

    def documents(self) -> Iterator[np.ndarray]:
        return self.shards.documents()
