"""The ``stdlib`` source: the Python standard library's own source code as a corpus.

Exactly what it reads: every file ending in ``.py`` under
``sysconfig.get_paths()["stdlib"]`` of the running interpreter (for CPython 3.11 on
Linux, ``<prefix>/lib/python3.11``), walking all subdirectories except those named
``site-packages``, ``dist-packages`` (installed packages, not the standard library),
``test``, ``tests``, ``idle_test`` (the test suites, which include files with
deliberately broken encodings) and ``__pycache__``. One file is one document (files
that are empty or only whitespace, such as some ``__init__.py``, give none), in
sorted order of its path relative to that directory (``/``-separated), decoded as UTF-8
with invalid bytes replaced. About 730 files and 12 MB on CPython 3.11; it needs no
download and is the same on every machine with the same Python version.

``max_files`` keeps the first N files of that order; ``max_bytes`` keeps the longest
prefix of it whose file sizes (bytes on disk) add up to at most that many bytes.
"""

from __future__ import annotations

import os
import platform
import sysconfig
from collections.abc import Iterator
from typing import Any

from forge_core.api import FileSet, ForgeError

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_files(root: str | None = None) -> list[str]:
    """Relative paths of the corpus files under ``root``, in corpus order."""
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.endswith(".py"):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)


class StdlibSource:
    def __init__(self, options: Any) -> None:
        for name in ("max_files", "max_bytes"):
            if getattr(options, name) < 0:
                raise ForgeError(f"data.source_options.{name} must be 0 (no limit) or positive.")
        self.root = sysconfig.get_paths()["stdlib"]
        files = stdlib_files(self.root)
        if options.max_files:
            files = files[: options.max_files]
        sizes = [os.path.getsize(os.path.join(self.root, f)) for f in files]
        if options.max_bytes:
            total = 0
            for n, size in enumerate(sizes):
                if total + size > options.max_bytes:
                    files, sizes = files[:n], sizes[:n]
                    break
                total += size
        if not files:
            raise ForgeError(
                f"stdlib source: no file selected under {self.root} (max_files="
                f"{options.max_files}, max_bytes={options.max_bytes}: the first file is "
                "larger than max_bytes, or the directory has no .py file)."
            )
        self.files = files
        self.bytes = sum(sizes)

    def describe(self) -> str:
        return (
            f"stdlib: Python {platform.python_version()} standard library at {self.root}, "
            f"{len(self.files)} .py files, {self.bytes / 1e6:.1f} MB"
        )

    def fingerprint_files(self) -> FileSet:
        """Every selected file, in corpus order (the token cache's key)."""
        return FileSet("stdlib/1", [os.path.join(self.root, f) for f in self.files], {})

    def fingerprint(self) -> str:
        return self.fingerprint_files().fingerprint()

    def documents(self) -> Iterator[str]:
        for rel in self.files:
            with open(os.path.join(self.root, rel), "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
            if text.strip():
                yield text
