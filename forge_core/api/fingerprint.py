"""Content fingerprints of files: what a file source's ``fingerprint()`` returns, and the
:class:`FileSet` a source names its files by so that the token cache hashes them once.

The token cache is keyed by a source's fingerprint, so it must change whenever the
documents the source yields could change, and should cost far less than tokenizing.
Paths, sizes and modification times are not enough (a file rewritten in place within
the same second, or copied with its times kept, looks the same; a touched file looks
changed), so :func:`files_fingerprint` hashes every byte of every file (SHA-256: about
1.5 GB/s per core, against tens of MB/s for a BPE tokenizer), in the order the source
reads them, together with the settings that decide how bytes become documents. Where a
file lives is not part of it: a corpus moved to another directory keeps its cache.

Hashing every byte at every start grows with the corpus (about 5 minutes at 10 B
tokens), so a source that reads files also names them with ``fingerprint_files()``,
returning a :class:`FileSet`. The token cache then hashes each file once, keeps its
digest in the cache's file manifest beside the file's identity (device, inode), size
and modification time in nanoseconds, and at later starts hashes again only a file
whose identity, size or time changed (:mod:`forge_core.data.manifest`). The
fingerprint is the same string :func:`files_fingerprint` gives::

    def fingerprint_files(self) -> FileSet:
        return FileSet("my_source/1", self.files, {"column": self.options.column})

    def fingerprint(self) -> str:
        return self.fingerprint_files().fingerprint()
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

import attrs

_CHUNK = 1 << 20

#: A record made less than this after its file's modification is not trusted: a file
#: still being written within the clock's granularity could change unseen (git's
#: "racy" rule).
RACY_NS = 2_000_000_000
STAT_FIELDS = ("device", "inode", "size", "mtime_ns")


def file_stat(path: str | os.PathLike) -> dict[str, int]:
    """The file's identity (device, inode), size and modification time in nanoseconds:
    what a record of something derived from its bytes is checked against."""
    st = os.stat(path)
    return {"device": st.st_dev, "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def stat_unchanged(record: Any, stat: dict[str, int], read_ns: str) -> bool:
    """Whether ``record`` (a mapping holding a file's :func:`file_stat` and, under the key
    ``read_ns``, the time its bytes were read, from ``time.time_ns()``) still describes
    the file whose stat is ``stat`` now: the same identity, size and modification time,
    read at least :data:`RACY_NS` after that modification. The token cache's file
    manifest trusts a hash this way, the ``token_file`` source its document boundaries."""
    return (
        isinstance(record, dict)
        and all(record.get(k) == stat[k] for k in STAT_FIELDS)
        and isinstance(record.get(read_ns), int)
        and record[read_ns] - stat["mtime_ns"] >= RACY_NS
    )


def file_digest(path: str) -> bytes:
    """SHA-256 of every byte of the file at ``path``."""
    h = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            h.update(view[:n])
    return h.digest()


@attrs.frozen
class FileSet:
    """The files a source reads, in reading order, under ``kind`` (name and version of
    the source's reading of bytes) and the ``settings`` (JSON) that cut them into
    documents."""

    kind: str
    files: tuple[str, ...] = attrs.field(converter=tuple)
    settings: dict[str, Any] = attrs.field(factory=dict)

    def combine(self, digests: Iterable[bytes]) -> str:
        """The fingerprint of these files, given the SHA-256 of each (in order)."""
        blob = json.dumps({"kind": self.kind, "settings": self.settings}, sort_keys=True, default=str)
        h = hashlib.sha256(blob.encode())
        for path, digest in zip(self.files, digests, strict=True):
            h.update(os.path.splitext(path)[1].encode() + b"\0" + digest)
        return f"sha256:{h.hexdigest()}"

    def fingerprint(self) -> str:
        """Every byte of every file hashed now: :func:`files_fingerprint`."""
        return self.combine(file_digest(path) for path in self.files)


def files_fingerprint(kind: str, files: Iterable[str], settings: dict[str, Any]) -> str:
    """SHA-256 over ``kind`` (name and version of the source's reading of bytes),
    ``settings`` (JSON) and, for each file in order, its extension and the SHA-256 of
    its bytes."""
    return FileSet(kind, tuple(files), settings).fingerprint()
