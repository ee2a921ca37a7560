"""The file manifest: each file of a source hashed once, then checked by stat at every start.

A source that names its files (``fingerprint_files()``, a
:class:`~forge_core.api.FileSet`) is fingerprinted here instead of by hashing every
byte at every start. Under the token cache directory, ``manifests/<key>.json`` (the key:
SHA-256 of the kind, the settings and the files' absolute paths) records for each file its
device, inode, size, modification time in nanoseconds and the SHA-256 of its bytes. At a
start, a file whose four stat fields all equal its record keeps the recorded digest;
any other (a new file, one replaced, grown, shrunk or touched) is hashed again, and the
manifest is rewritten atomically. The fingerprint is the one
:func:`~forge_core.api.files_fingerprint` gives for the same bytes, so the cache keys
(and entries) are those of a full hash.

What a stat cannot see:

- a record made while its file could still change within the file system's clock
  granularity (its mtime less than 2 s before the moment it was hashed:
  :func:`~forge_core.api.unstable.stat_unchanged`) is not trusted: the file is hashed again at the
  next start (git's "racy" rule);
- an edit that keeps the size and restores the modification time (``os.utime``, or a
  clock set back) is the documented limit. :func:`fingerprint` with ``verify=True``
  (``forge-run prepare CONFIG --verify``) hashes every file whatever its stat says,
  names the files whose bytes changed under an unchanged stat, and corrects the manifest.

A manifest that is missing, damaged or of another version is ignored (every file is
hashed); one that cannot be written (a read-only cache) only costs the hashing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import attrs

from forge_core.api import fingerprint as fp
from forge_core.api.files import atomic_write
from forge_core.api.fingerprint import STAT_FIELDS, file_stat, stat_unchanged

FORMAT = "forge-file-manifest"
VERSION = 1
DIRECTORY = "manifests"


@attrs.frozen
class Checked:
    """What one fingerprinting found: the fingerprint, the files whose bytes differed
    from a record their stat matched (only ``verify`` looks at every such file), and
    the manifest's path."""

    fingerprint: str
    stale: tuple[str, ...]
    manifest: Path


def manifest_path(root: str | os.PathLike, files: fp.FileSet, paths: list[str] | None = None) -> Path:
    """Where the manifest of ``files`` (at absolute ``paths``) lives under the cache
    directory ``root``."""
    paths = [os.path.abspath(p) for p in files.files] if paths is None else paths
    blob = json.dumps(
        {"kind": files.kind, "settings": files.settings, "files": paths}, sort_keys=True, default=str
    )
    return Path(root).expanduser() / DIRECTORY / f"{hashlib.sha256(blob.encode()).hexdigest()[:32]}.json"


def _records(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") == FORMAT and data.get("version") == VERSION:
            return {str(k): dict(v) for k, v in data["files"].items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass
    return {}


def _trusted(record: dict[str, Any] | None, stat: dict[str, int]) -> bool:
    return stat_unchanged(record, stat, "hashed_ns") and isinstance(record.get("sha256"), str)


def fingerprint(files: fp.FileSet, root: str | os.PathLike, *, verify: bool = False) -> Checked:
    """The fingerprint of ``files``, hashing only the files the manifest under ``root``
    cannot vouch for (every file under ``verify``); see the module docstring."""
    # Absolute, not real, paths: no symlink is resolved (a start stats each file once);
    # os.stat follows links, so a link moved to another file shows as another inode.
    paths = [os.path.abspath(p) for p in files.files]
    where = manifest_path(root, files, paths)
    old = _records(where)
    new: dict[str, dict[str, Any]] = {}
    digests, stale = [], []
    for path, absolute in zip(files.files, paths):
        stat = file_stat(path)  # before hashing: a change while hashing shows at the next start
        record = old.get(absolute)
        if not verify and _trusted(record, stat):
            digest = bytes.fromhex(record["sha256"])
            new[absolute] = record
        else:
            hashed_ns = time.time_ns()
            digest = fp.file_digest(path)
            same_stat = record is not None and all(record.get(k) == stat[k] for k in STAT_FIELDS)
            if same_stat and record.get("sha256") != digest.hex():
                stale.append(path)
            keep = verify and same_stat and record.get("sha256") == digest.hex()
            new[absolute] = record if keep else {**stat, "sha256": digest.hex(), "hashed_ns": hashed_ns}
        digests.append(digest)
    if new != old:
        _write(where, files, new)
    return Checked(files.combine(digests), tuple(stale), where)


def _write(where: Path, files: fp.FileSet, records: dict[str, dict[str, Any]]) -> None:
    body = {"format": FORMAT, "version": VERSION, "kind": files.kind, "settings": files.settings}
    text = json.dumps({**body, "files": records}, indent=1, sort_keys=True, default=str) + "\n"
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(where, text)
    except OSError:
        pass  # a read-only cache directory: the next start hashes again, nothing is wrong
