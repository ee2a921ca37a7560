"""The ``text`` source: documents from ``.txt`` and ``.jsonl`` files matched by globs.

- Order: patterns in the order given; the files each pattern matches, sorted; a file
  matched by two patterns is read once, at its first place.
- ``.jsonl``: one JSON object per line, the document is ``record[text_field]`` (a
  string). Blank lines are skipped.
- Any other file is text: the whole file is one document, or, with a ``separator``, the
  pieces between occurrences of it.
- A leading UTF-8 byte-order mark is dropped; documents that are empty or only
  whitespace are skipped (whitespace inside a document is kept as is).
- ``records()`` (chat data, ``data.chat``): every JSON object of the ``.jsonl`` files,
  whole, with where it is (``"path, line N"``); any other file is an error.
- Errors name the file (and the line): a pattern matching no file, an empty file or one
  without a document, invalid UTF-8 or a NUL byte (a binary file) under
  ``encoding_errors: strict``, a JSON Lines line that is not a JSON object or lacks the
  text field.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
from collections.abc import Iterator
from typing import Any

from forge_core.api import FileSet, ForgeError
from forge_core.api.unstable import chat_hint

OPTION = "data.source_options"


class TextSource:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.files = resolve(options.paths)

    def describe(self) -> str:
        n_jsonl = sum(f.endswith(".jsonl") for f in self.files)
        return (
            f"text: {len(self.files)} files ({len(self.files) - n_jsonl} text, {n_jsonl} "
            f"JSON Lines) from {', '.join(self.options.paths)}"
        )

    def fingerprint_files(self) -> FileSet:
        """The files in reading order and the settings that cut them into documents (what
        the token cache is keyed by; where the files are is not part of it)."""
        o = self.options
        return FileSet(
            "text/1",
            self.files,
            {"separator": o.separator, "text_field": o.text_field, "encoding_errors": o.encoding_errors},
        )

    def fingerprint(self) -> str:
        return self.fingerprint_files().fingerprint()

    def documents(self) -> Iterator[str]:
        for path in self.files:
            if path.endswith(".jsonl"):
                found = yield from read_jsonl(path, self.options.text_field, self.options.encoding_errors)
            else:
                found = yield from read_text(path, self.options.separator, self.options.encoding_errors)
            if not found:
                raise ForgeError(
                    f"{path}: contains no document (only whitespace, separators or blank lines)."
                )

    def records(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(where, record)`` for every record of the JSON Lines files (chat data)."""
        for path in self.files:
            if not path.endswith(".jsonl"):
                raise ForgeError(
                    f"{OPTION}.paths: {path} is not a .jsonl file; chat records (data.chat.format) are "
                    "read from JSON Lines, one object per line."
                )
            yield from json_objects(path, self.options.encoding_errors)


def json_objects(path: str, errors: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("path, line N", object)`` for every non-blank line of a JSON Lines file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if not raw.strip():
                continue
            line = decode(raw, errors, path, lineno)
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ForgeError(
                    f"{path}, line {lineno}: not valid JSON ({exc.msg}, column {exc.colno})."
                ) from None
            if not isinstance(record, dict):
                raise ForgeError(
                    f"{path}, line {lineno}: expected a JSON object, got {type(record).__name__}."
                )
            yield f"{path}, line {lineno}", record


def resolve(patterns: list[str]) -> list[str]:
    """Expand ``patterns`` into the ordered, de-duplicated list of files to read."""
    if not patterns:
        raise ForgeError(
            f"{OPTION}.paths is empty: list the files or glob patterns to read, for example ['data/*.txt']."
        )
    files: list[str] = []
    seen: set[str] = set()
    for pattern in patterns:
        if not glob.has_magic(pattern):
            if os.path.isdir(pattern):
                raise ForgeError(
                    f"{OPTION}.paths: {pattern!r} is a directory; give a pattern such as "
                    f"{os.path.join(pattern, '**', '*.txt')!r}."
                )
            if not os.path.isfile(pattern):
                raise ForgeError(
                    f"{OPTION}.paths: no such file {pattern!r} (working directory {os.getcwd()})."
                )
            matched = [pattern]
        else:
            matched = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matched:
                raise ForgeError(
                    f"{OPTION}.paths: pattern {pattern!r} matches no file (working directory {os.getcwd()})."
                )
        for path in matched:
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                files.append(path)
    for path in files:
        if os.path.getsize(path) == 0:
            raise ForgeError(f"{path}: file is empty.")
    return files


def decode(data: bytes, errors: str, path: str, line: int | None = None) -> str:
    """UTF-8 ``data`` as text; under ``strict`` an error naming the file and line (for
    invalid UTF-8, and for a NUL byte: no text holds one, binary files do)."""
    nul = data.find(b"\0") if errors == "strict" else -1
    if nul >= 0:
        where = line if line is not None else data.count(b"\n", 0, nul) + 1
        raise ForgeError(
            f"{path}, line {where}: a NUL byte (at byte {nul}): this looks like a binary file, not text. "
            f"Remove it from {OPTION}.paths, or set {OPTION}.encoding_errors: replace to read it anyway."
        )
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as exc:
        where = line if line is not None else data.count(b"\n", 0, exc.start) + 1
        raise ForgeError(
            f"{path}, line {where}: invalid UTF-8 ({exc.reason} at byte "
            f"{data[exc.start : exc.end]!r}). Fix the file, or set "
            f"{OPTION}.encoding_errors: replace to substitute U+FFFD."
        ) from None


def read_text(path: str, separator: str, errors: str) -> Iterator[str]:
    """Yield the documents of one text file; return how many there were."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    text = decode(data, errors, path)
    pieces = text.split(separator) if separator else [text]
    found = 0
    for piece in pieces:
        if piece.strip():
            found += 1
            yield piece
    return found


def read_jsonl(path: str, field: str, errors: str) -> Iterator[str]:
    """Yield ``record[field]`` of every record of one JSON Lines file; return the count."""
    found = 0
    for where, record in json_objects(path, errors):
        if field not in record:
            keys = ", ".join(sorted(map(str, record))) or "none"
            hint = chat_hint(list(record))
            raise ForgeError(
                f"{where}: no field {field!r} (fields: {keys})."
                + (hint or f" Set {OPTION}.text_field to the field that holds the text.")
            )
        text = record[field]
        if not isinstance(text, str):
            raise ForgeError(f"{where}: field {field!r} is {type(text).__name__}, not a string.")
        if text.strip():
            found += 1
            yield text
    return found
