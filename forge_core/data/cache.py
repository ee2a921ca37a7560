"""The token cache: a source is tokenized once, and every later run (or restart) opens
the result in milliseconds.

An entry is a shard directory (:mod:`forge_core.api.shards`) named by a key:
SHA-256 of the source's content fingerprint (:mod:`forge_core.data.fingerprint`; the
files of a source that names them are hashed once and checked by stat afterwards, in
``manifests/``: :mod:`forge_core.data.manifest`), the
tokenizer's ``identity`` and the shard format version. A changed file, another
tokenizer or another format version therefore gives another key, and the old entry is
never read; an entry whose own index disagrees with its key (copied or edited by hand,
another format version written under the same name) is refused with an error naming
it, never used.

Writing is atomic: an entry is written to ``<key>.partial-<host>-<pid>`` and renamed to
``<key>`` only when complete (``index.json`` last, everything fsynced), so a crash at
any point leaves no entry a later run would trust; the next process to build that key
removes the leftover.

Several processes (the ranks of a job, on one node or, with a shared cache directory,
on several) build an entry once: each takes an exclusive ``flock`` on ``<key>.lock``
before building. The first builds; the others wait, report who holds the lock (its pid,
host and start time, written into the lock file) every 30 seconds, and open the entry
once it appears. The kernel releases a ``flock`` when its holder dies, so a crashed
builder never blocks the next one. A wait longer than ``data.cache.wait_s`` is an error
that says who was holding the lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError
from forge_core.api.shards import INDEX, VERSION

FORMAT = "forge-token-cache"
#: Seconds between two "waiting for ..." notes.
NOTE_EVERY = 30.0
POLL = 0.2


def default_root() -> Path:
    """``$FORGE_CACHE_DIR/data``, else ``$XDG_CACHE_HOME/forge/data``, else ``~/.cache/forge/data``."""
    if os.environ.get("FORGE_CACHE_DIR"):
        return Path(os.environ["FORGE_CACHE_DIR"]) / "data"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "forge" / "data"


def cache_key(fingerprint: str, tokenizer_identity: str) -> str:
    blob = json.dumps(
        {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint, "tokenizer": tokenizer_identity},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class _Lock:
    """An exclusive ``flock`` on a file that records its holder."""

    def __init__(self, path: Path) -> None:
        import fcntl

        self._fcntl = fcntl
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def try_acquire(self) -> bool:
        try:
            self._fcntl.flock(self.fd, self._fcntl.LOCK_EX | self._fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        os.ftruncate(self.fd, 0)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
        return True

    def holder(self) -> str:
        try:
            return os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "another process"
        except OSError:
            return "another process"

    def close(self) -> None:
        os.close(self.fd)  # closing the descriptor releases the lock


def _complete(entry: Path) -> bool:
    return (entry / INDEX).is_file()


def open_entry(entry: Path, key: str, fingerprint: str, tokenizer: Any) -> Any:
    """The shards of a complete entry, after checking it is the one asked for."""
    from forge_core.api.shards import Shards

    try:
        shards = Shards(entry)
    except ForgeError as exc:
        raise ForgeError(
            f"the token cache entry {entry} is unusable: {exc} Delete that directory; "
            "the next run tokenizes the source again."
        ) from None
    index_path = entry / INDEX
    made = shards.index.get("cache", {})
    problems = []
    if made.get("key") != key or made.get("fingerprint") != fingerprint:
        problems.append(
            f"it was made for source fingerprint {made.get('fingerprint')!r}, "
            f"this source's is {fingerprint!r}"
        )
    wanted = {
        "identity": tokenizer.identity,
        "vocab_size": int(tokenizer.vocab_size),
        "eos_id": int(tokenizer.eos_id),
        "pad_id": int(tokenizer.pad_id),
    }
    for field, value in wanted.items():
        if shards.tokenizer.get(field) != value:
            problems.append(
                f"it was made with tokenizer {field} {shards.tokenizer.get(field)!r}, the "
                f"configured tokenizer has {value!r}"
            )
            break
    if problems:
        raise ForgeError(
            f"{index_path}: refusing this token cache entry: {'; '.join(problems)}. It is not "
            f"what its name ({key}) promises; delete {entry} and run again."
        )
    return shards


def cached_shards(
    source: Any,
    tokenizer: Any,
    *,
    root: str | os.PathLike,
    wait_s: float,
    label: str,
    progress: bool = True,
    report: Callable[[str], None] = lambda message: None,
    announce: Callable[[str], None] = lambda message: None,
) -> tuple[Any, str]:
    """The source's tokens from the cache under ``root``, building the entry if no
    process has: ``(Shards, what happened)``. ``report`` receives the waiting notes (give
    it to one process per job), ``announce`` the note of the process that tokenizes."""
    from forge_core.data.fingerprint import source_fingerprint
    from forge_core.data.prepare import write_shards

    root = Path(root).expanduser()
    fingerprint = source_fingerprint(source, root)
    key = cache_key(fingerprint, tokenizer.identity)
    entry = root / key
    if _complete(entry):
        return open_entry(entry, key, fingerprint, tokenizer), f"cached at {entry}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = _Lock(root / f"{key}.lock")
    except OSError as exc:
        raise ForgeError(
            f"cannot use the token cache directory {root} ({exc.strerror or exc}). Set "
            "data.cache.dir to a writable directory."
        ) from None
    try:
        started = time.monotonic()
        next_note = started
        while not lock.try_acquire():
            if _complete(entry):
                return open_entry(
                    entry, key, fingerprint, tokenizer
                ), f"cached at {entry} (by another process)"
            waited = time.monotonic() - started
            if waited > wait_s:
                raise ForgeError(
                    f"gave up after {waited:.0f} s waiting for {lock.holder()} to tokenize {label} "
                    f"into {entry} (data.cache.wait_s: {wait_s:g}). Raise data.cache.wait_s, or tokenize "
                    "before launching with `forge-run prepare` and train on the shards."
                )
            if time.monotonic() >= next_note:
                report(
                    f"waiting for {lock.holder()} to tokenize {label} into {entry} ({waited:.0f} s so far, "
                    f"at most {wait_s:g} s)"
                )
                next_note += NOTE_EVERY
            time.sleep(POLL)
        if _complete(entry):  # finished between our first look and the lock
            return open_entry(entry, key, fingerprint, tokenizer), f"cached at {entry} (by another process)"
        for leftover in root.glob(f"{key}.partial-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # a crashed builder's: we hold the lock
        announce(f"tokenizing {label} into the cache {entry} (once: later runs reuse it)")
        tmp = root / f"{key}.partial-{socket.gethostname()}-{os.getpid()}"
        t0 = time.perf_counter()
        write_shards(
            source,
            tokenizer,
            entry,
            tmp,
            progress=progress,
            extra={"cache": {"key": key, "fingerprint": fingerprint}},
        )
        return open_entry(entry, key, fingerprint, tokenizer), (
            f"tokenized into {entry} in {time.perf_counter() - t0:.1f}s"
        )
    finally:
        lock.close()
