"""Content fingerprints of sources: what the token cache is keyed by.

A source's own ``fingerprint()`` comes first (the built-in file sources hash every byte
they read with :func:`forge_core.api.files_fingerprint`). A source that defines none is
fingerprinted by :func:`documents_fingerprint`: one pass over its documents, each
hashed as it comes (no tokenizing); slower than hashing files, but sound for any
source.
"""

from __future__ import annotations

import hashlib
from typing import Any


def documents_fingerprint(source: Any) -> str:
    """SHA-256 over every document of ``source`` (text as UTF-8, token ids as int64)."""
    from forge_core.data.pipeline import document_hash

    h = hashlib.sha256(b"documents")
    for document in source.documents():
        h.update(document_hash(document))
    return f"documents-sha256:{h.hexdigest()}"


def source_fingerprint(source: Any) -> str:
    """``source.fingerprint()`` when it has one, else :func:`documents_fingerprint`."""
    own = getattr(source, "fingerprint", None)
    if callable(own):
        value = own()
        if not isinstance(value, str) or not value:
            raise TypeError(
                f"{type(source).__name__}.fingerprint() must return a non-empty string, got {value!r}"
            )
        return value
    return documents_fingerprint(source)
