"""The held-out split: which documents a run never trains on.

A document is held out when a hash of its content, mixed with ``seed``, falls below
``fraction`` of the 64-bit range:

    held_out = splitmix64(content_hash ^ splitmix64(seed)) < fraction * 2**64

``content_hash`` is the per-document hash a shard stores (``hashes.npy``: BLAKE2b of
the document as the source gave it, see :mod:`forge_core.api.shards`). So the split is

- document-level: a document is wholly on one side, never cut;
- stable: it depends on the document alone, not on its position or on the rest of the
  corpus, so adding documents moves none of the old ones across; nor does changing the
  tokenizer;
- consistent for duplicates: identical documents share a side, so no text is both
  trained on and evaluated on;
- sized by ``fraction`` in expectation (the realized share is reported).

:func:`heldout_mask` is the whole rule; :func:`forge_core.data.build.heldout_documents`
gives an evaluation loop the held-out documents of a config.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise on uint64 (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def heldout_mask(hashes: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """``True`` for every document (by content hash) that is held out."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    if fraction <= 0:
        return np.zeros(len(hashes), bool)
    if fraction >= 1:
        return np.ones(len(hashes), bool)
    key = splitmix64(np.array([seed], dtype=np.uint64))[0]
    threshold = np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))
    return splitmix64(hashes ^ key) < threshold
