"""Writing to disk so that a crash never leaves a torn result, and saying plainly why a
directory cannot be written: what the trainer's run directory, its checkpoints, the
token shards, exports and a plugin's own files (a tracker's run id, a loss curve) use.

- :func:`atomic_write`: replace one file, so a reader sees the old or the new content.
- :func:`sync_tree`: flush every file and directory under a directory to disk.
- :func:`move_into_place`: make a directory written aside (``<out>.partial``) appear as
  ``out`` in one step, replacing an older one only once the new one is whole (a
  symlinked ``out``: the directory it points to).
- :func:`directory_problem`: why a directory cannot be used to write in, without
  creating anything (what ``forge-run check`` reports and the run refuses).
- :func:`read_small_text`: a small metadata file (a Hub cache ref, ``config.json``, a
  template) read only when it is a regular file of bounded size, so that a FIFO or
  ``/dev/zero`` in its place is refused instead of hanging or exhausting memory.

Torch-free.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from forge_core.api.errors import ForgeError

#: The temporary files :func:`atomic_write` writes beside their target,
#: ``.<name>.tmp<pid>``: a crash can leave one, and whoever owns the directory may remove
#: them (while no writer is running).
ATOMIC_TMP_RE = re.compile(r"^\..+\.tmp\d+$")


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


def move_into_place(tmp: Path, out: Path, *, replace: bool = True) -> None:
    """Rename the complete directory ``tmp`` to ``out``, its contents flushed to disk
    first. An existing ``out`` is moved aside to ``<out>.old`` and removed only once
    ``tmp`` has taken its place; when that last rename fails, ``out`` is put back as it
    was (and ``tmp`` left for the caller to remove). With ``replace=False`` an existing
    ``out`` is not touched: the rename fails (``OSError``) unless ``out`` is an empty
    directory.

    An ``out`` that is a symbolic link means the directory it points to: that directory
    is replaced and the link kept (replacing the link itself would leave the old
    directory behind under its real name). Write ``tmp`` beside the link's target
    (``os.path.realpath(out)``): a rename cannot cross file systems."""
    tmp, out = Path(tmp), Path(os.path.realpath(out))
    sync_tree(tmp)
    old = out.with_name(out.name + ".old")
    if replace and out.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
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
