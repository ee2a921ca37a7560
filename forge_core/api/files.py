"""Writing to disk so that a crash never leaves a torn result, and saying plainly why a
directory cannot be written: what the trainer's run directory, its checkpoints, the
token shards, exports and a plugin's own files (a tracker's run id, a loss curve) use.

- :func:`atomic_write`: replace one file, so a reader sees the old or the new content.
- :func:`sync_tree`: flush every file and directory under a directory to disk.
- :func:`temporary_dir`: a directory beside ``out`` to write its new content in, under
  a name no user chose (``.<out>.forge-partial-<random>``, made exclusively) and holding
  :data:`TEMPORARY_MARKER`, so Forge can prove later that it is its own;
  :func:`remove_temporary` removes one only when it can, and :func:`leftover_temporaries`
  finds those an interrupted writer left.
- :func:`move_into_place`: make a directory written aside appear as ``out`` in one step,
  replacing an older one only once the new one is whole (a symlinked ``out``: the
  directory it points to). Nothing but ``out`` itself and Forge's own temporaries is
  ever removed: no fixed sibling name (``out.old``, ``out.partial``) is touched.
- :func:`directory_problem`: why a directory cannot be used to write in, without
  creating anything (what ``forge-run check`` reports and the run refuses).
- :func:`read_small_text`: a small metadata file (a Hub cache ref, ``config.json``, a
  template) read only when it is a regular file of bounded size, so that a FIFO or
  ``/dev/zero`` in its place is refused instead of hanging or exhausting memory.

Torch-free.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from forge_core.api.errors import ForgeError

#: The temporary files :func:`atomic_write` writes beside their target,
#: ``.<name>.tmp<pid>``: a crash can leave one, and whoever owns the directory may remove
#: them (while no writer is running).
ATOMIC_TMP_RE = re.compile(r"^\..+\.tmp\d+$")

#: The file :func:`temporary_dir` writes first into every directory it makes (the host
#: and process writing there): a directory without it is never removed as a temporary.
TEMPORARY_MARKER = ".forge-temporary"
_PARTIAL = "forge-partial-"
_ASIDE = "forge-old-"


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (best effort: some file systems
    refuse to fsync a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) so a reader sees the old
    or the new file, never a torn one, and the new one survives a crash once this
    returns. On any failure the temporary file is removed and ``path`` is as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def sync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` to disk, so that once it is renamed
    no crash can leave a short file under the final name."""
    for directory, _, names in os.walk(root):
        for name in names:
            file = os.path.join(directory, name)
            if os.path.islink(file):
                continue
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))


def _prefix(out: Path, kind: str) -> str:
    return f".{out.name}.{kind}"


def temporary_dir(out: str | os.PathLike) -> Path:
    """A new directory beside ``out`` to write ``out``'s content in before
    :func:`move_into_place`: named ``.<out name>.forge-partial-<random>`` by
    ``tempfile.mkdtemp`` (created exclusively: never a directory that was there) and
    holding :data:`TEMPORARY_MARKER` (which :func:`move_into_place` takes out)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(out, _PARTIAL), dir=out.parent))
    marker = {"host": socket.gethostname(), "pid": os.getpid()}
    (tmp / TEMPORARY_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
    return tmp


def _writer(path: Path) -> dict | None:
    """What the marker of the temporary ``path`` says, or ``None`` when ``path`` is not
    one of Forge's temporaries (a real directory, not a link, holding the marker)."""
    if path.is_symlink() or not path.is_dir():
        return None
    marker = path / TEMPORARY_MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        found = json.loads(marker.read_text(encoding="utf-8")[:4096])
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return found if isinstance(found, dict) else None


def remove_temporary(path: str | os.PathLike) -> bool:
    """Remove ``path`` if it is one of Forge's temporaries (:func:`temporary_dir`), and
    say whether it was; anything else is left as it is."""
    path = Path(path)
    if _writer(path) is None:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True  # unknown: treat as in use
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def leftover_temporaries(out: str | os.PathLike, *, running: bool = False) -> list[Path]:
    """Forge's temporaries for ``out`` (:func:`temporary_dir`) left by a writer that is no
    longer running on this host; with ``running``, every one (also those being written
    now, or written on another host)."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    found = []
    for path in sorted(out.parent.glob(_prefix(out, _PARTIAL) + "*")):
        writer = _writer(path)
        if writer is None:
            continue
        gone = writer.get("host") == socket.gethostname() and not _alive(writer.get("pid"))
        if running or gone:
            found.append(path)
    return found


def move_into_place(tmp: Path, out: Path, *, replace: bool = True) -> None:
    """Rename the complete directory ``tmp`` to ``out``, its contents flushed to disk
    first (and :data:`TEMPORARY_MARKER` taken out of it). An existing ``out`` is moved
    aside to a new, unique name beside it (``.<out>.forge-old-<random>``) and removed
    only once ``tmp`` has taken its place; when that last rename fails, ``out`` is put
    back as it was (and ``tmp``, marked again, left for the caller to remove). No other
    directory is touched. With ``replace=False`` an existing ``out`` is not touched: the
    rename fails (``OSError``) unless ``out`` is an empty directory.

    An ``out`` that is a symbolic link means the directory it points to: that directory
    is replaced and the link kept (replacing the link itself would leave the old
    directory behind under its real name). Write ``tmp`` beside the link's target
    (``os.path.realpath(out)``): a rename cannot cross file systems."""
    tmp, out = Path(tmp), Path(os.path.realpath(out))
    marker = tmp / TEMPORARY_MARKER
    mark = marker.read_bytes() if marker.is_file() and not marker.is_symlink() else None
    marker.unlink(missing_ok=True)
    try:
        sync_tree(tmp)
        if replace and out.exists():
            # mkdtemp makes the name ours; renaming a directory onto an empty one replaces it.
            old = Path(tempfile.mkdtemp(prefix=_prefix(out, _ASIDE), dir=out.parent))
            try:
                os.replace(out, old)
            except BaseException:
                old.rmdir()
                raise
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)
                raise
            fsync_dir(out.parent)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
            fsync_dir(out.parent)
    except BaseException:
        if mark is not None and tmp.is_dir():
            marker.write_bytes(mark)
        raise


def _nearest_existing(path: Path) -> Path:
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    return ancestor


def directory_problem(path: Path) -> str | None:
    """Why ``path`` cannot be used as a directory to write in (created when missing), as
    words that follow the quoted path (``exists and is not a directory``), or ``None``
    when it can. Creates nothing: ``forge-run check`` asks, the run then creates."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            return "exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is not writable by this user"
        return None
    ancestor = _nearest_existing(path)
    if not ancestor.is_dir():
        return f"cannot be created: {str(ancestor)!r} is a file"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be created: {str(ancestor)!r} is not writable by this user"
    return None


#: The bound :func:`read_small_text` callers give metadata files (``config.json``,
#: ``tokenizer_config.json``, a safetensors index): far above any real one.
METADATA_LIMIT = 32 << 20


class FileRefused(ForgeError):
    """A file that :func:`read_small_text` will not read (not a regular file, or too
    large); its message names the file and why. Not an ``OSError``: code that treats an
    unreadable file as absent must not take a FIFO for a missing file silently."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read_small_text(path: str | os.PathLike[str], limit: int, what: str) -> str:
    """The UTF-8 text of ``path``, read only when it is a regular file (a symlink to one
    counts) of at most ``limit`` bytes. A FIFO, a device (``/dev/zero``), a directory
    or a larger file is refused with :class:`FileRefused` naming ``what`` (``"the Hub
    cache ref"``), the path and why; checked on the open file itself, which is opened
    without blocking, so a FIFO can neither hang the open nor be swapped in after a
    check. A missing or unreadable file raises ``OSError`` as ``open`` does; bytes that
    are not UTF-8, ``UnicodeDecodeError``."""
    # O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer forever.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(
                f"{what} {os.fspath(path)!r} is {_kind(mode)}, not a regular file: it is not read "
                "(it could block or never end). Replace it with the file it should be"
            )
        data = b""
        while len(data) <= limit:  # bounded, whatever the file's size says or becomes
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(
            f"{what} {os.fspath(path)!r} is more than the {limit} bytes such a file may be: it is not "
            "read. Replace it with the file it should be"
        )
    return data.decode("utf-8")
