"""Content fingerprints of sources: what the token cache is keyed by.

A source that names its files (``fingerprint_files()``, a
:class:`~forge_core.api.FileSet`) is fingerprinted through the cache's file manifest
(:mod:`forge_core.data.manifest`): each file is hashed once and checked by stat at
later starts, so a start does not read the corpus. Otherwise the source's own
``fingerprint()`` comes first, computed at every start. A source that defines neither
is fingerprinted by :func:`documents_fingerprint`: one pass over its documents, each
hashed as it comes (no tokenizing); slower than hashing files, but sound for any
source.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from forge_core.api import FileFingerprintedSource, FileSet, FingerprintedSource


def documents_fingerprint(source: Any) -> str:
    """SHA-256 over every document of ``source`` (text as UTF-8, token ids as int64)."""
    from forge_core.data.pipeline import document_hash

    h = hashlib.sha256(b"documents")
    for document in source.documents():
        h.update(document_hash(document))
    return f"documents-sha256:{h.hexdigest()}"


def file_set(source: Any) -> FileSet | None:
    """``source.fingerprint_files()`` when it has one, else ``None``."""
    if not isinstance(source, FileFingerprintedSource):
        return None
    value = source.fingerprint_files()
    if not isinstance(value, FileSet):
        raise TypeError(
            f"{type(source).__name__}.fingerprint_files() must return a forge_core.api.FileSet, got {value!r}"
        )
    return value


def source_fingerprint(source: Any, manifests: str | os.PathLike | None = None) -> str:
    """The fingerprint of ``source``: through the file manifest under ``manifests`` (the
    token cache directory) when the source names its files, else ``source.fingerprint()``
    when it has one, else :func:`documents_fingerprint`."""
    files = file_set(source) if manifests is not None else None
    if files is not None:
        from forge_core.data.manifest import fingerprint

        return fingerprint(files, manifests).fingerprint
    if isinstance(source, FingerprintedSource):
        value = source.fingerprint()
        if not isinstance(value, str) or not value:
            raise TypeError(
                f"{type(source).__name__}.fingerprint() must return a non-empty string, got {value!r}"
            )
        return value
    files = file_set(source)
    if files is not None:
        return files.fingerprint()
    return documents_fingerprint(source)
