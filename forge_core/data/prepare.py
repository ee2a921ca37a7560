"""``forge-run prepare``: tokenize a source once into shards a run can memory-map.

The output is deterministic (same source and tokenizer: byte-identical files; no
timestamps) and appears atomically: everything is written in a temporary directory
beside ``out_dir`` (:func:`~forge_core.api.files.temporary_dir`) and renamed to
``out_dir`` only when complete, so an interrupted prepare leaves no directory that looks
whole. What an earlier, interrupted prepare left (a temporary that Forge marked as its
own, whose writer is gone) is reported and removed before writing; nothing else beside
``out_dir`` is touched (a folder named ``<out_dir>.partial`` or ``<out_dir>.old`` is the
user's). On an error the temporary is removed too. The format is
:mod:`forge_core.api.shards`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError
from forge_core.api.files import leftover_temporaries, remove_temporary
from forge_core.data.pipeline import tokenize
from forge_core.data.shards import TOKENIZER_DIR, ShardWriter


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def prepare(
    source: Any,
    tokenizer: Any,
    out_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
    report: Callable[[str], None] = _stderr,
) -> dict[str, Any]:
    """Tokenize every document of ``source`` into the shard directory ``out_dir``.

    The tokenizer saves itself into ``out_dir/tokenizer``. Returns the shard index
    (what ``index.json`` holds). ``out_dir`` must not exist unless ``overwrite`` (then
    it is replaced only once the new one is complete). ``report`` receives the
    human-readable notes (leftover removed, summary).
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise ForgeError(f"{out} already exists. Choose another directory or pass --overwrite.")
    for leftover in leftover_temporaries(out):
        report(f"{leftover}: left by an interrupted prepare; removing it.")
        remove_temporary(leftover)
    index = write_shards(
        source, tokenizer, out, None, progress=progress, replace=overwrite, save_tokenizer=True
    )
    report(
        f"{out}: {index['num_documents']} documents, {index['num_tokens']} tokens "
        f"({index['dtype']}), tokenizer {tokenizer.identity}"
    )
    return index


def write_shards(
    source: Any,
    tokenizer: Any,
    out: Path,
    tmp: Path | None,
    *,
    progress: bool = True,
    replace: bool = False,
    save_tokenizer: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokenize ``source`` into ``tmp`` (a new temporary beside ``out`` when ``None``) and
    rename it to ``out`` once complete (``tmp`` is removed on any error, a crash leaves
    only ``tmp``). Returns the index."""
    writer = ShardWriter(
        out,
        {
            "identity": tokenizer.identity,
            "vocab_size": int(tokenizer.vocab_size),
            "eos_id": int(tokenizer.eos_id),
            "pad_id": int(tokenizer.pad_id),
        },
        tmp=tmp,
    )
    try:
        for batch, hashes in tokenize(source, tokenizer, progress=progress):
            writer.add(batch, hashes)
        if not writer.num_documents:
            raise ForgeError(f"{source.describe()}: the source yielded no document; nothing to prepare.")
        if save_tokenizer:
            tok_dir = writer.tmp / TOKENIZER_DIR
            tok_dir.mkdir()
            tokenizer.save(str(tok_dir))
        return writer.commit(source.describe(), replace=replace, extra=extra)
    except BaseException:
        writer.abort()
        raise
