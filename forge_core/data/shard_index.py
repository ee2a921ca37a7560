"""Validate a shard directory's ``index.json`` and files without reading any token:
json and file sizes only, no numpy, so ``forge-run check`` can judge a ``shards`` path
in milliseconds. :class:`forge_core.data.shards.Shards` opens a directory through
:func:`read_index` too, so check and build refuse the same directories with the same
words. The format itself is described in :mod:`forge_core.data.shards`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError

FORMAT = "forge-shards"
VERSION = 2
INDEX = "index.json"
PARTIAL_SUFFIX = ".partial"
#: Bytes per token of each dtype ``forge-run prepare`` writes.
ITEMSIZE = {"uint16": 2, "uint32": 4}


def partial_dir(out_dir: str | os.PathLike) -> Path:
    """Where a shard directory is written before it is complete."""
    out = Path(out_dir)
    return out.with_name(out.name + PARTIAL_SUFFIX)


def read_index(path: str | os.PathLike) -> dict[str, Any]:
    """The index of a complete shard directory; a :class:`ForgeError` saying what is wrong
    otherwise (missing, interrupted, not a shard index, another format version, a data
    file missing or of the wrong size)."""
    path = Path(path)
    index_path = path / INDEX
    if not path.is_dir():
        if partial_dir(path).exists():
            raise ForgeError(
                f"{path}: not there, but {partial_dir(path)} is: an earlier "
                "`forge-run prepare` was interrupted. Run it again (it removes the "
                "leftover first)."
            )
        if path.exists():
            raise ForgeError(f"{path}: not a directory; give the directory `forge-run prepare` wrote.")
        raise ForgeError(f"{path}: no such shard directory. Create it with `forge-run prepare`.")
    if not index_path.is_file():
        raise ForgeError(f"{index_path}: missing; {path} is not a complete `forge-run prepare` output.")
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ForgeError(f"{index_path}: not valid JSON ({exc}).") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ForgeError(f"{index_path}: not a Forge shard index (format {FORMAT!r} expected).")
    if index.get("version") != VERSION:
        raise ForgeError(
            f"{index_path}: shard format version {index.get('version')}, this Forge reads "
            f"version {VERSION}. Run `forge-run prepare` again."
        )
    try:
        files = index["files"]
        tokens_path, offsets_path, hashes_path = (path / files[k] for k in ("tokens", "offsets", "hashes"))
        itemsize = ITEMSIZE[index["dtype"]]
        num_tokens, num_documents = int(index["num_tokens"]), int(index["num_documents"])
        identity = index["tokenizer"]["identity"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ForgeError(f"{index_path}: incomplete or damaged index ({type(exc).__name__}: {exc}).") from None
    if num_tokens < 0 or num_documents < 0 or not isinstance(identity, str):
        raise ForgeError(f"{index_path}: damaged index (negative counts or no tokenizer identity).")
    for p in (tokens_path, offsets_path, hashes_path):
        if not p.is_file():
            raise ForgeError(f"{p}: missing from the shard directory {path}.")
    expected = num_tokens * itemsize
    if tokens_path.stat().st_size != expected:
        raise ForgeError(
            f"{tokens_path}: {tokens_path.stat().st_size} bytes, the index says "
            f"{num_tokens} tokens of {index['dtype']} ({expected} bytes). The "
            "shard is damaged: run `forge-run prepare` again."
        )
    return index
