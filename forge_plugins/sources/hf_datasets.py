"""The ``hf_datasets`` source: a text column of a Hugging Face ``datasets`` data set on
local disk, never downloaded.

- ``path``: a folder written by ``save_to_disk`` (``datasets.load_from_disk``; a saved
  ``DatasetDict`` is read at ``split``);
- ``data_files``: local Parquet, JSON Lines, Arrow, CSV or text files
  (``datasets.load_dataset(format, data_files=..., split=...)``);
- ``streaming``: iterate without materializing (``streaming=True``, or
  ``to_iterable_dataset()`` for a saved folder): the same documents in the same order.
  The spec names it as its ``streaming_option``, so the run trains on it as a stream
  (:mod:`forge_core.data.stream`: tokenized ahead while training, no token cache).

One row is one document: its ``text_field``; rows whose text is empty or whitespace are
skipped. Errors name the folder or files and the row: a missing path, a pattern matching
nothing, a folder ``datasets`` cannot read, a split or column that is absent, a value
that is not a string (``forge-run check`` finds a missing column or split already,
:mod:`~forge_plugins.sources.hf_fields`). ``datasets`` is an optional dependency (``pip install
'forge-trainer[datasets]'``), imported only when the source is built; Forge sets
``HF_DATASETS_OFFLINE`` and ``HF_HUB_OFFLINE`` before importing it, so nothing is fetched.

``datasets``' own progress bars ("Generating train split", "Loading dataset from disk")
are switched off while the source loads (and switched back on after, if they were on):
in a log file their redraws are raw carriage returns and escape codes, and Forge reports
the source's progress itself.

The fingerprint (the token cache's key) hashes every byte of the files read, with the
format, split and column (once: the cache's file manifest checks them by stat later).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from forge_core.api import FileSet, ForgeError
from forge_core.api.unstable import chat_hint

OPTION = "data.source_options"
EXTRA = "pip install 'forge-trainer[datasets]'"
FORMATS = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".arrow": "arrow",
    ".csv": "csv",
    ".txt": "text",
}
BATCH = 1024


def import_datasets() -> Any:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise ForgeError(
            f"the hf_datasets source needs the `datasets` package, which is not installed: {EXTRA}"
        ) from None
    return datasets


@contextmanager
def quiet(datasets: Any) -> Iterator[None]:
    """``datasets`` without its progress bars, as it was afterwards."""
    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


def saved_files(path: str) -> list[str]:
    """Every file of a ``save_to_disk`` folder, sorted; an error when it is not one."""
    if not path:
        raise ForgeError(f"{OPTION}: give `path` (a save_to_disk folder) or `data_files`.")
    if not os.path.isdir(path):
        raise ForgeError(
            f"{OPTION}.path: {path!r} is not a directory "
            f"({'a file' if os.path.exists(path) else 'it does not exist'})."
        )
    names = set(os.listdir(path))
    if not names & {"dataset_info.json", "state.json", "dataset_dict.json"}:
        raise ForgeError(
            f"{OPTION}.path: {path!r} is not a folder written by `save_to_disk` (no "
            "dataset_info.json, state.json or dataset_dict.json)."
        )
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    return sorted(files, key=lambda p: os.path.relpath(p, path))


def data_files(patterns: list[str], fmt: str) -> tuple[list[str], str]:
    """The files the patterns match, in order, and their builder."""
    files: list[str] = []
    for pattern in patterns:
        matched = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matched:
            raise ForgeError(
                f"{OPTION}.data_files: {pattern!r} matches no file (working directory {os.getcwd()})."
            )
        files += [p for p in matched if p not in files]
    for path in files:
        if os.path.getsize(path) == 0:
            raise ForgeError(f"{path}: file is empty.")
    if fmt:
        return files, fmt
    kinds = {FORMATS.get(os.path.splitext(p)[1].lower()) for p in files}
    if None in kinds or len(kinds) != 1:
        exts = sorted({os.path.splitext(p)[1] or "(none)" for p in files})
        raise ForgeError(
            f"{OPTION}.data_files: cannot infer one format from the extensions {', '.join(exts)} "
            f"(known: {', '.join(sorted(FORMATS))}); set {OPTION}.format."
        )
    return files, kinds.pop()


class HFDatasetsSource:
    def __init__(self, options: Any) -> None:
        self.options = options
        if bool(options.path) == bool(options.data_files):
            raise ForgeError(
                f"{OPTION}: give exactly one of `path` (a save_to_disk folder) and `data_files`."
            )
        if options.path:
            self.files, self.format = saved_files(options.path), "saved"
            self.where = options.path
        else:
            self.files, self.format = data_files(options.data_files, options.format)
            self.where = ", ".join(self.files[:3]) + (
                f" (+{len(self.files) - 3} more)" if len(self.files) > 3 else ""
            )
        self.datasets = import_datasets()

    def describe(self) -> str:
        what = (
            f"saved data set {self.options.path}"
            if self.options.path
            else f"{len(self.files)} {self.format} files"
        )
        mode = ", streaming" if self.options.streaming else ""
        return f"hf_datasets: {what}, split {self.options.split!r}, column {self.options.text_field!r}{mode}"

    def fingerprint_files(self) -> FileSet:
        o = self.options
        return FileSet(
            "hf_datasets/1", self.files, {"format": self.format, "split": o.split, "text_field": o.text_field}
        )

    def fingerprint(self) -> str:
        return self.fingerprint_files().fingerprint()

    def _load(self) -> Any:
        with quiet(self.datasets):
            return self._load_quietly()

    def _load_quietly(self) -> Any:
        ds, o = self.datasets, self.options
        try:
            if o.path:
                data = ds.load_from_disk(o.path)
                if isinstance(data, ds.DatasetDict):
                    if o.split not in data:
                        raise ForgeError(
                            f"{o.path}: no split {o.split!r} (splits: {', '.join(data)}); set {OPTION}.split."
                        )
                    data = data[o.split]
                return data.to_iterable_dataset() if o.streaming else data
            return ds.load_dataset(
                self.format, data_files={o.split: self.files}, split=o.split, streaming=o.streaming
            )
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - datasets and pyarrow raise many kinds
            raise ForgeError(
                f"{self.where}: datasets cannot read it ({type(exc).__name__}: {str(exc)[:300]})."
            ) from None

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(where, row)`` for every row, all columns (chat data, ``data.chat``)."""
        data = self._load()
        row = 0
        try:
            for batch in data.iter(batch_size=BATCH):
                columns = list(batch)
                for values in zip(*(batch[c] for c in columns)):
                    yield f"{self.where}, row {row}", dict(zip(columns, values))
                    row += 1
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ForgeError(
                f"{self.where}, near row {row}: datasets cannot read it ({type(exc).__name__}: "
                f"{str(exc)[:300]})."
            ) from None

    def documents(self) -> Iterator[str]:
        field = self.options.text_field
        data = self._load()
        columns = data.column_names
        if columns is not None and field not in columns:
            hint = chat_hint(list(columns))
            raise ForgeError(
                f"{self.where}: no column {field!r} (columns: {', '.join(columns)})."
                + (hint or f" Set {OPTION}.text_field to the column that holds the text.")
            )
        row, found = 0, 0
        try:
            for batch in (
                data.select_columns([field]).iter(batch_size=BATCH)
                if columns
                else data.iter(batch_size=BATCH)
            ):
                if field not in batch:
                    raise ForgeError(
                        f"{self.where}, row {row}: no column {field!r} (columns: {', '.join(batch)})."
                    )
                for text in batch[field]:
                    if not isinstance(text, str):
                        raise ForgeError(
                            f"{self.where}, row {row}: {field!r} is {type(text).__name__}, not a string."
                        )
                    row += 1
                    if text.strip():
                        found += 1
                        yield text
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ForgeError(
                f"{self.where}, near row {row}: datasets cannot read it ({type(exc).__name__}: "
                f"{str(exc)[:300]})."
            ) from None
        if not found:
            raise ForgeError(f"{self.where}: contains no document (no row with text in {field!r}).")
