"""The fields an ``hf_datasets`` source's data holds, read the cheap way for ``forge-run
check`` (no torch, no ``datasets``): a saved folder's ``dataset_info.json``, a Parquet
file's schema (its footer, through pyarrow), an Arrow stream's schema, the first record
of a JSON Lines file, a CSV header. Only the first file of ``data_files`` is read:
``datasets`` refuses files whose columns differ anyway. ``None`` where the fields cannot
be told this way (a JSON array, pyarrow missing, an unreadable file: the build says why);
a message where a metadata file is no small regular file (a FIFO would hang the build).
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any

from forge_core.api.unstable import METADATA_LIMIT, FileRefused, read_small_text

#: Bytes of a JSON Lines file read for its first record.
FIRST_RECORD_BYTES = 1 << 20


def _saved(path: str, split: str) -> list[str] | str | None:
    """Features of a ``save_to_disk`` folder (a DatasetDict: of its ``split``), or a
    message when the split is absent."""
    folder = path
    splits_file = os.path.join(path, "dataset_dict.json")
    if os.path.isfile(splits_file):
        splits = json.loads(_read(splits_file)).get("splits", [])
        if split not in splits:
            return f"{path}: no split {split!r} (splits: {', '.join(splits)})"
        folder = os.path.join(path, split)
    features = json.loads(_read(os.path.join(folder, "dataset_info.json"))).get("features")
    return list(features) if isinstance(features, dict) else None


def _read(path: str) -> str:
    return read_small_text(path, METADATA_LIMIT, os.path.basename(path))


def _first_json_record(path: str) -> list[str] | None:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                return list(record) if isinstance(record, dict) else None
            if f.tell() > FIRST_RECORD_BYTES:
                break
    return None


def _file(path: str, fmt: str) -> list[str] | None:
    if fmt == "text":
        return ["text"]  # datasets' text builder: one column, "text"
    if fmt == "json":
        return _first_json_record(path)
    if fmt == "csv":
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            return next(csv.reader(f), None)
    import pyarrow  # with datasets; ImportError: cannot tell

    if fmt == "parquet":
        import pyarrow.parquet

        return list(pyarrow.parquet.read_schema(path).names)
    with pyarrow.memory_map(path) as source:  # arrow: datasets writes IPC streams
        return list(pyarrow.ipc.open_stream(source).schema.names)


def fields(options: Any, files: list[str], fmt: str) -> tuple[list[str] | str | None, str]:
    """``(fields, where)``: the fields of the data the options name and what was read
    (a message instead of the fields when a saved DatasetDict lacks the split)."""
    try:
        if options.path:
            return _saved(options.path, options.split), options.path
        return _file(files[0], fmt), files[0]
    except FileRefused as exc:  # a FIFO would hang the build as well: say so now
        return str(exc), options.path
    except Exception:  # noqa: BLE001 - json, csv, pyarrow and the file system raise many kinds
        # Whatever keeps the fields from being read cheaply, the build reads the data
        # with datasets and names the problem; check only speaks when it knows.
        return None, options.path or files[0]
