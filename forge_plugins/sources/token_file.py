"""The ``token_file`` source: one flat file of token ids, documents split at EOS, read in
place through a numpy memory map (no token cache).

- ``.npy``: a 1-D integer array (``np.save``), read with its own dtype
  (``np.load(mmap_mode="r")``); ``dtype``, when given, must agree.
- any other name (usually ``.bin``): raw little-endian integers of ``dtype`` (required),
  as nanoGPT-style pipelines write them.

Documents are the runs of tokens between the configured tokenizer's EOS tokens: EOS
ends (or, in files that put it first, starts) a document and is not part of it; Forge
appends EOS to every document. Empty runs (two EOS in a row, a leading or trailing EOS)
are dropped; the last run needs no EOS after it. Finding the EOS tokens is one pass
over the file at every start (chunked, a few GB/s); a Megatron index avoids it.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from typing import Any

from forge_core.api import ForgeError, TokenDocuments

OPTION = "$.data.source_options"
#: Tokens scanned for EOS at a time (bounds the memory of the scan).
CHUNK = 1 << 24
_INTEGER = {"|u1": "uint8", "<u2": "uint16", "<u4": "uint32", "<i2": "int16", "<i4": "int32", "<i8": "int64"}
ITEMSIZE = {"uint8": 1, "uint16": 2, "uint32": 4, "int16": 2, "int32": 4, "int64": 8}


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
        import numpy as np

        tokens = self._tokens()
        eos = [np.flatnonzero(tokens[i : i + CHUNK] == eos_id) + i for i in range(0, len(tokens), CHUNK)]
        cuts = np.concatenate(eos) if eos else np.zeros(0, np.int64)
        starts = np.concatenate([[0], cuts + 1])  # after each EOS
        ends = np.concatenate([cuts, [len(tokens)]])
        keep = ends > starts
        return TokenDocuments(tokens, starts[keep], (ends - starts)[keep], self.path)

    def documents(self) -> Iterator[Any]:
        raise ForgeError(
            f"{self.describe()}: its documents are split at the tokenizer's EOS, so it is read only "
            "by a run (which knows the tokenizer); it needs no `forge-run prepare`."
        )
