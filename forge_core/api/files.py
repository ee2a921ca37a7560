"""Writing files so that a crash never leaves a torn one: what the trainer's run
directory, its checkpoints and a plugin's own state files (a tracker's run id) use.
Torch-free."""

from __future__ import annotations

import os
from pathlib import Path

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


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a reader sees the old or the new file, never a
    torn one, and the new one survives a crash once this returns."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
