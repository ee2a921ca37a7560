"""The ``token_file`` source: one flat file of token ids, documents split at EOS, read in
place through a numpy memory map (no token cache).

- ``.npy``: a 1-D integer array (``np.save``), read with its own dtype
  (``np.load(mmap_mode="r")``); ``dtype``, when given, must agree.
- any other name (usually ``.bin``): raw little-endian integers of ``dtype`` (required),
  as nanoGPT-style pipelines write them.

Documents are the runs of tokens between the configured tokenizer's EOS tokens: EOS
ends (or, in files that put it first, starts) a document and is not part of it; Forge
appends EOS to every document. Empty runs (two EOS in a row, a leading or trailing EOS)
are dropped; the last run needs no EOS after it.

Finding the EOS tokens is one pass over the file (chunked, a few GB/s), made once: the
document boundaries are kept beside the file in a sidecar, ``<file>.eos<id>.docs.npz``
(their starts and lengths, with the file's device, inode, size and modification time
in nanoseconds, and the EOS id), so that a later start reads a few bytes per document
instead of the whole corpus. A sidecar is trusted only when all four stat fields equal
the file's and the scan began at least 2 s after the file's modification (a file still
being written within the clock's granularity could change unseen: git's "racy" rule,
checked by :func:`~forge_core.api.unstable.stat_unchanged` as for the cache's file
manifest); anything else (a changed, replaced, touched or still-fresh file, another
EOS, a damaged or foreign sidecar) is scanned again and the sidecar rewritten
atomically. A directory that cannot be written only costs the scan at every start.
"""

from __future__ import annotations

import ast
import io
import json
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError, TokenDocuments
from forge_core.api.unstable import atomic_write, file_stat, stat_unchanged

OPTION = "$.data.source_options"
#: Tokens scanned for EOS at a time (bounds the memory of the scan).
CHUNK = 1 << 24
_INTEGER = {"|u1": "uint8", "<u2": "uint16", "<u4": "uint32", "<i2": "int16", "<i4": "int32", "<i8": "int64"}
ITEMSIZE = {"uint8": 1, "uint16": 2, "uint32": 4, "int16": 2, "int32": 4, "int64": 8}
SIDECAR_FORMAT = "forge-token-file-documents"
SIDECAR_VERSION = 1


def _npy_header(path: str) -> tuple[str, tuple[int, ...], bool]:
    """``(descr, shape, fortran_order)`` of a ``.npy`` file, read without numpy."""
    with open(path, "rb") as f:
        head = f.read(10)
        if len(head) < 10 or not head.startswith(b"\x93NUMPY"):
            raise ForgeError(f"{OPTION}.path: {path} is not a .npy file (no \\x93NUMPY magic).")
        major = head[6]
        if major == 1:
            size = int.from_bytes(head[8:10], "little")
            text = f.read(size)
        else:
            size = int.from_bytes(head[8:10] + f.read(2), "little")
            text = f.read(size)
    try:
        header = ast.literal_eval(text.decode("latin1"))
        return str(header["descr"]), tuple(header["shape"]), bool(header["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        raise ForgeError(f"{OPTION}.path: {path}: its .npy header is damaged.") from None


def check_file(options: Any) -> str:
    """The dtype of the file ``options`` name, after the checks ``forge-run check`` can
    make without numpy (the file exists; its format, dtype and size); an error naming the
    field and the file otherwise."""
    path = options.path
    if not path:
        raise ForgeError(f"{OPTION}.path is empty: give a .npy file or a raw token file (with dtype).")
    if not os.path.isfile(path):
        raise ForgeError(f"{OPTION}.path: {path} does not exist (working directory {os.getcwd()}).")
    if path.endswith(".npy"):
        descr, shape, _ = _npy_header(path)
        if descr not in _INTEGER or len(shape) != 1:
            raise ForgeError(
                f"{OPTION}.path: {path} holds an array of {descr}, shape {shape}; token ids are a 1-D "
                f"array of one of {', '.join(_INTEGER.values())}."
            )
        if options.dtype and options.dtype != _INTEGER[descr]:
            raise ForgeError(
                f"{OPTION}.dtype is {options.dtype!r}, but {path} holds {_INTEGER[descr]}: leave dtype "
                "empty for a .npy file (it says its own)."
            )
        return _INTEGER[descr]
    if not options.dtype:
        raise ForgeError(
            f"{OPTION}.dtype is empty, but {path} is a raw token file: say its integer type "
            f"({', '.join(ITEMSIZE)}), or save it as .npy."
        )
    size = os.path.getsize(path)
    if size % ITEMSIZE[options.dtype]:
        raise ForgeError(
            f"{OPTION}.dtype: {path} has {size} bytes, not a whole number of {options.dtype} tokens: "
            "is the dtype right?"
        )
    return options.dtype


class TokenFileSource:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.path = options.path
        self.dtype = check_file(options)

    def describe(self) -> str:
        return f"token_file: {self.path} ({self.dtype}, documents split at EOS)"

    def _tokens(self) -> Any:
        import numpy as np

        if self.path.endswith(".npy"):
            return np.load(self.path, mmap_mode="r")
        dtype = np.dtype(self.dtype).newbyteorder("<")
        if not os.path.getsize(self.path):
            return np.zeros(0, dtype)
        return np.memmap(self.path, dtype=dtype, mode="r")

    def token_documents(self, eos_id: int) -> TokenDocuments:
        stat = file_stat(self.path)  # before reading: a change during the scan shows next time
        tokens = self._tokens()
        found = read_sidecar(self.path, eos_id, stat, len(tokens))
        if found is None:
            scanned_ns = time.time_ns()
            found = scan(tokens, eos_id)
            write_sidecar(self.path, eos_id, {**stat, "scanned_ns": scanned_ns}, *found)
        return TokenDocuments(tokens, found[0], found[1], self.path)

    def documents(self) -> Iterator[Any]:
        raise ForgeError(
            f"{self.describe()}: its documents are split at the tokenizer's EOS, so it is read only "
            "by a run (which knows the tokenizer); it needs no `forge-run prepare`."
        )


def scan(tokens: Any, eos_id: int) -> tuple[Any, Any]:
    """``(starts, lengths)`` of the non-empty runs between ``eos_id`` tokens."""
    import numpy as np

    eos = [np.flatnonzero(tokens[i : i + CHUNK] == eos_id) + i for i in range(0, len(tokens), CHUNK)]
    cuts = np.concatenate(eos) if eos else np.zeros(0, np.int64)
    starts = np.concatenate([[0], cuts + 1]).astype(np.int64)  # after each EOS
    ends = np.concatenate([cuts, [len(tokens)]]).astype(np.int64)
    keep = ends > starts
    return starts[keep], (ends - starts)[keep]


def sidecar_path(path: str, eos_id: int) -> Path:
    return Path(f"{path}.eos{eos_id}.docs.npz")


def read_sidecar(path: str, eos_id: int, stat: dict[str, int], num_tokens: int) -> tuple[Any, Any] | None:
    """The boundaries a trusted sidecar holds (see the module docstring), or None."""
    import numpy as np

    try:
        with np.load(sidecar_path(path, eos_id), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            starts, lengths = np.asarray(z["starts"]), np.asarray(z["lengths"])
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None
    trusted = (
        isinstance(meta, dict)
        and meta.get("format") == SIDECAR_FORMAT
        and meta.get("version") == SIDECAR_VERSION
        and meta.get("eos_id") == eos_id
        and stat_unchanged(meta, stat, "scanned_ns")
    )
    # Boundaries that cannot be those of this file (a hand-edited sidecar) are not used.
    sane = (
        starts.ndim == lengths.ndim == 1
        and starts.shape == lengths.shape
        and starts.dtype == lengths.dtype == np.int64
        and bool((lengths > 0).all())
        and bool((starts >= 0).all())
        and bool((starts + lengths <= num_tokens).all())
    )
    return (starts, lengths) if trusted and sane else None


def write_sidecar(path: str, eos_id: int, stat: dict[str, int], starts: Any, lengths: Any) -> None:
    import numpy as np

    meta = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "eos_id": eos_id, **stat}
    buffer = io.BytesIO()
    np.savez(buffer, starts=starts, lengths=lengths, meta=np.array(json.dumps(meta)))
    try:
        atomic_write(sidecar_path(path, eos_id), buffer.getvalue())
    except OSError:
        pass  # a read-only directory: the next start scans again, nothing is wrong
