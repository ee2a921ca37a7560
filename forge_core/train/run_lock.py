"""One run per run directory: ``<out_dir>/run.lock``. The same lock
(:meth:`RunLock.take`) keeps two ``forge-run prepare`` off one output directory.

Two runs writing one ``run.out_dir`` would resume from each other's checkpoints in
flight, delete each other's temporaries and interleave their metrics. Rank 0 of a run
takes the lock before it writes anything (the other ranks wait for its verdict) and
holds it until the run ends.

The lock is an ``flock`` on ``run.lock``, which the kernel releases when the holder
dies, so a run killed with SIGKILL never blocks the next one. The file also says who
holds it (pid, host, start time, command), for the refusal message, and guards file
systems where ``flock`` does nothing: a holder recorded on this host whose process is
still alive (same pid, same process start time) is respected even when the ``flock``
could be taken. A lock left by a dead process is taken over with a warning. Nothing
waits: a held lock is refused at once.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError
from forge_core.api.files import directory_problem

LOCK = "run.lock"
OUT_DIR = "$.run.out_dir"


def _process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    now = _process_start(pid)
    return start is None or now is None or now == start


def describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (it has not recorded who it is yet)"
    text = f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}"
    return f"{text} ({holder['command']})" if holder.get("command") else text


def ensure_out_dir(out_dir: Path, what: str = OUT_DIR, fix: str = "") -> None:
    """Create ``out_dir`` or say plainly why it cannot be (a :class:`ForgeError` naming
    ``what``, the value and a fix): the reasons ``forge-run check`` gives
    (:func:`~forge_core.api.files.directory_problem`), then what creating it met."""
    fix = fix or "Set run.out_dir to a directory you can write (for example runs/NAME)."
    why = directory_problem(out_dir)
    if why:
        raise ForgeError(f"{what}: {str(out_dir)!r} {why}. {fix}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ForgeError(
            f"{what}: {str(out_dir)!r} cannot be created ({exc.strerror or exc}). {fix}"
        ) from None


class RunLock:
    """The lock on one run directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.recorded = False

    @classmethod
    def acquire(cls, out_dir: str | Path, warn: Callable[[str], None] | None = None) -> RunLock:
        """Take the lock on ``out_dir`` (created if needed), or raise :class:`ForgeError`
        naming the run that holds it."""
        out_dir = Path(out_dir)
        ensure_out_dir(out_dir)
        return cls.take(
            out_dir / LOCK, OUT_DIR, cls._held, warn, "Set run.out_dir to a directory you can write."
        )

    @classmethod
    def take(
        cls,
        path: Path,
        what: str,
        held: Callable[[Path, dict[str, Any]], ForgeError],
        warn: Callable[[str], None] | None = None,
        fix: str = "",
    ) -> RunLock:
        """Take the lock file ``path`` (its directory exists), the same way for any
        directory one process at a time may write: ``held(path, holder)`` is the refusal
        when another live process has it; ``what`` (a config path or an argument) and
        ``fix`` head and end the error when the file cannot be written."""
        warn = warn or (lambda message: None)
        for _ in range(10):  # the file may be replaced under us by a holder releasing it
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ForgeError(
                    f"{what}: cannot write in {str(path.parent)!r} ({exc.strerror or exc}). {fix}"
                ) from None
            try:
                lock = cls._take(path, fd, warn, held)
            except BaseException:
                os.close(fd)
                raise
            if lock is not None:
                return lock
            os.close(fd)
        raise ForgeError(
            f"{what}: cannot take the lock {path}: it keeps changing. Is another process "
            f"starting on {str(path.parent)!r}?"
        )

    @classmethod
    def _take(
        cls,
        path: Path,
        fd: int,
        warn: Callable[[str], None],
        held: Callable[[Path, dict[str, Any]], ForgeError],
    ) -> RunLock | None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise held(path, _read(fd)) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # No flock on this file system: the recorded holder alone decides.
        try:
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                return None  # released and removed between open and flock: try again
        except FileNotFoundError:
            return None
        previous = _read(fd)
        pid = previous.get("pid")
        if isinstance(pid, int) and pid != os.getpid():
            same_host = previous.get("host") == socket.gethostname()
            start = previous.get("proc_start")
            if same_host and _alive(pid, start if isinstance(start, int) else None):
                raise held(path, previous)
            why = (
                "that process is no longer running"
                if same_host
                else "it was on another host and has let go of the lock"
            )
            warn(
                f"taking over the lock {path} left by {describe(previous)}: {why} (it did not end "
                f"cleanly; what it left unfinished is removed)"
            )
        lock = cls(path, fd)
        lock.record()
        return lock

    @staticmethod
    def _held(path: Path, holder: dict[str, Any]) -> ForgeError:
        return ForgeError(
            f"{OUT_DIR}: {str(path.parent)!r} is in use by another run: {describe(holder)}. Two runs on "
            f"one directory overwrite each other's checkpoints and metrics. Wait for that run to end "
            f"(or stop it), or give this one another run.out_dir. The lock is {path}; it is released "
            f"when its holder exits, even when killed."
        )

    def record(self) -> None:
        """Write who holds the lock. On a full disk this can fail: the lock still holds
        (the flock is what excludes), so the caller can free space and record again."""
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "proc_start": _process_start(os.getpid()),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300],
        }
        data = (json.dumps(holder) + "\n").encode()
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)
            os.fsync(self.fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            return
        self.recorded = True

    def release(self) -> None:
        """Remove the file (so no stale holder is left to report) and let go."""
        if self.fd < 0:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
