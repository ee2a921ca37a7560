"""Options of the built-in sources. Light on purpose: imported by ``forge-run check``."""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import at_least, non_blank, option, path_fits

EncodingErrors = Literal["strict", "replace"]

_ENCODING_DOC = (
    "What to do with bytes that are not valid UTF-8: 'strict' stops with an error naming "
    "the file and line; 'replace' substitutes U+FFFD and goes on."
)


@attrs.frozen
class TextOptions:
    paths: list[str] = option(
        [],
        "Files or glob patterns (`**` recurses), relative to the working "
        "directory. Patterns are read in the order given, the files each matches in "
        "sorted order; a file matched twice is read once. A pattern that matches "
        "nothing is an error. Files ending in `.jsonl` are JSON Lines, all others text.",
    )
    separator: str = option(
        "",
        "How a text file is cut into documents: '' (the default) makes each "
        "file one document; any other string splits the file on every occurrence of "
        'it exactly (for example "\\n\\n" or "<|endoftext|>").',
    )
    text_field: str = option(
        "text",
        "The field of each JSON Lines record that holds the document text.",
        non_blank,
    )
    encoding_errors: EncodingErrors = option("strict", _ENCODING_DOC)


@attrs.frozen
class ShardsOptions:
    path: str = option(
        "",
        "Directory written by `forge-run prepare`. Its tokenizer must be the "
        "configured `data.tokenizer` (same identity), or the run stops.",
        path_fits,
    )


@attrs.frozen
class StdlibOptions:
    max_files: int = option(
        0,
        "Read at most this many files (the first in sorted order); 0: no limit.",
        at_least(0),
    )
    max_bytes: int = option(
        0,
        "Read the longest run of files, in sorted order, whose sizes add up to "
        "at most this many bytes; 0: no limit.",
        at_least(0),
    )


@attrs.frozen
class HFDatasetsOptions:
    path: str = option(
        "",
        "A folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk` "
        "(read with `datasets.load_from_disk`). Give this or `data_files`.",
        path_fits,
    )
    data_files: list[str] = option(
        [],
        "Local files or glob patterns (`**` recurses) of one format: Parquet, JSON "
        "Lines, Arrow, CSV or text, read with `datasets.load_dataset(format, data_files=...)`. "
        "Patterns in the order given, the files each matches sorted.",
    )
    format: Literal["", "parquet", "json", "arrow", "csv", "text"] = option(
        "",
        "The `datasets` builder for `data_files`; '' infers it from the extension.",
    )
    split: str = option(
        "train",
        "The split to read (of a saved `DatasetDict`, or of `data_files`).",
        non_blank,
    )
    text_field: str = option("text", "The column that holds the document text.", non_blank)
    streaming: bool = option(
        False,
        "Stream the data set (`streaming=True`, or `to_iterable_dataset()` for a saved "
        "folder): training starts at once while a background thread tokenizes ahead, "
        "without the token cache, as under `data.stream.enabled` (its settings apply). The "
        "documents and their order are the same.",
    )


@attrs.frozen
class MegatronOptions:
    path: str = option(
        "",
        "A Megatron-LM indexed dataset: the path prefix of its `PREFIX.bin` (the tokens) "
        "and `PREFIX.idx` (the index), as given to Megatron's `--data-path`; a path ending "
        "in `.bin` or `.idx` names the same pair. Its documents are those of the index.",
    )
    append_eod: bool = option(
        False,
        "The data was written with `preprocess_data.py --append-eod`: every document ends "
        "with the EOS token, which is dropped (Forge appends EOS to every document itself). "
        "A document that does not end with the configured tokenizer's EOS is then an error.",
    )


TokenDtype = Literal["", "uint8", "uint16", "uint32", "int16", "int32", "int64"]


@attrs.frozen
class TokenFileOptions:
    path: str = option(
        "",
        "A flat file of token ids: `.npy` (a 1-D integer array, read with its own dtype) "
        "or raw little-endian integers of `dtype` (any other name, usually `.bin`). "
        "Documents are the runs of tokens between the configured tokenizer's EOS tokens; "
        "empty runs are dropped and the last run needs no EOS after it.",
    )
    dtype: TokenDtype = option(
        "",
        "The integer type of a raw file (required for it); for `.npy`, '' or the array's own dtype.",
    )
