"""Rules of the built-in sources: what ``forge-run check`` can see of their files without
reading a document. Each calls the function the source itself runs when it is built
(``resolve`` of the text source, the stdlib file selection, the shard index reader), so
check and build refuse the same inputs with the same words. They are rules, not option
validators, because they judge the file system of the machine that checks or trains,
not the value itself (the same options are read back later from a run directory)."""

from __future__ import annotations

from typing import Any

from forge_core.api import ForgeError
from forge_core.api.unstable import did_you_mean, read_shard_index
from forge_plugins.sources.options import (
    HFDatasetsOptions,
    MegatronOptions,
    ShardsOptions,
    StdlibOptions,
    TextOptions,
    TokenFileOptions,
)

TEXT_FILES = "text.files-exist"
SHARDS_DIR = "shards.directory"
STDLIB_FILES = "stdlib.files-selected"
HF_DATASETS = "hf_datasets.readable"
MEGATRON = "megatron.index"
TOKEN_FILE = "token_file.readable"
CHAT_RECORDS = "text.chat-records"

#: Built-in tokenizers and the prefix of the identity each writes into a shard index.
_BUILTIN_TOKENIZERS = ("byte", "hf")


def _entries(ctx: Any, cls: type) -> list[tuple[str, Any]]:
    """``(prefix, options)`` of every source entry whose options are ``cls``; the prefix
    names the entry of a mixture (``"data.sources[1]: "``), nothing for one source."""
    return [
        ("" if where == "data.source" else f"{where}: ", entry.options)
        for where, entry in ctx.config.data.source_entries()
        if isinstance(entry.options, cls)
    ]


def _problems(ctx: Any, cls: type, build: Any) -> list[str]:
    problems = []
    for prefix, options in _entries(ctx, cls):
        try:
            build(options)
        except ForgeError as exc:
            problems.append(prefix + str(exc))
    return problems


def check_text_files(ctx: Any) -> list[str]:
    from forge_plugins.sources.text import resolve

    return _problems(ctx, TextOptions, lambda options: resolve(options.paths))


def check_stdlib_files(ctx: Any) -> list[str]:
    from forge_plugins.sources.stdlib import StdlibSource

    return _problems(ctx, StdlibOptions, StdlibSource)


def _chat_fields_problem(found: list[str], where: str, fmt: str) -> str | None:
    """Why records with ``found`` fields cannot be read as ``data.chat.format`` ``fmt``."""
    from forge_core.api.unstable import missing_fields

    absent = missing_fields(fmt, found)
    if not absent:
        return None
    return (
        f"data.chat.format: {fmt!r} reads {' and '.join(absent)}, which the first record of "
        f"{where} lacks (fields: {', '.join(found) or 'none'}). Set data.chat.format to the shape of the "
        "records (messages, prompt_completion, preference), or rename the fields."
    )


def check_chat_records(ctx: Any) -> list[str]:
    """For chat data: the text source reads only JSON Lines, and each file's first record
    has the fields the format reads. For text: a JSON Lines file whose first record lacks
    ``text_field`` but has a chat format's fields is chat data without ``data.chat``."""
    fmt = ctx.config.data.chat.format
    from forge_plugins.sources.hf_fields import _first_json_record
    from forge_plugins.sources.text import resolve

    def readable(options: Any) -> None:
        if not fmt:
            try:
                paths = resolve(options.paths)
            except ForgeError:
                return  # reported by text.files-exist
            # The first JSON Lines file says what the records are (check stays cheap on
            # sources of thousands of files; the build names any other).
            jsonl = next((p for p in paths if p.endswith(".jsonl")), None)
            if jsonl is not None:
                _text_records(jsonl, options.text_field)
            return
        for path in resolve(options.paths):
            if not path.endswith(".jsonl"):
                raise ForgeError(
                    f"data.source_options.paths: {path} is not a .jsonl file; chat records "
                    f"(data.chat.format: {fmt}) are read from JSON Lines, one object per line."
                )
            try:
                found = _first_json_record(path)
            except (OSError, ValueError):
                continue  # the build reads the file and names the line
            if found is not None and (problem := _chat_fields_problem(found, path, fmt)):
                raise ForgeError(problem)

    return _problems(ctx, TextOptions, readable)


def _text_records(path: str, field: str) -> None:
    """Refuse a JSON Lines file whose first record is chat data read as text."""
    from forge_core.api.unstable import chat_hint
    from forge_plugins.sources.hf_fields import _first_json_record

    try:
        found = _first_json_record(path)
    except (OSError, ValueError):
        return  # the build reads the file and names the line
    if found is not None and field not in found and (hint := chat_hint(found)):
        raise ForgeError(
            f"data.source_options.text_field: the first record of {path} has no field {field!r} "
            f"(fields: {', '.join(found)}), and data.chat.format is not set.{hint}"
        )


def _text_field_problem(options: Any, files: list[str], fmt: str, chat: str = "") -> str | None:
    """Why ``text_field`` (with ``chat``, the chat format's fields) is not a field of the
    data (read without torch or datasets), or None: it is one, or the fields cannot be
    told cheaply."""
    from forge_plugins.sources.hf_datasets import OPTION
    from forge_plugins.sources.hf_fields import fields

    found, where = fields(options, files, fmt)
    if found is None or isinstance(found, str):
        return found  # unknown, or a saved DatasetDict without the split
    if chat:
        return _chat_fields_problem(found, where, chat)
    field = options.text_field
    if field in found:
        return None
    from forge_core.api.unstable import chat_hint

    fix = chat_hint(found) or (
        f"{did_you_mean(field, found)} Set {OPTION}.text_field to the field that holds the text."
    )
    return f"{OPTION}.text_field: {field!r} is not a field of {where} (fields: {', '.join(found)}).{fix}"


def check_hf_datasets(ctx: Any) -> list[str]:
    import importlib.util

    from forge_plugins.sources import hf_datasets as hf

    def readable(options: Any) -> None:
        if bool(options.path) == bool(options.data_files):
            raise ForgeError(
                f"{hf.OPTION}: give exactly one of `path` (a save_to_disk folder) and `data_files`."
            )
        if options.path:
            files, fmt = hf.saved_files(options.path), "saved"
        else:
            files, fmt = hf.data_files(options.data_files, options.format)
        # The files exist: do they hold the text field (the build finds out only when it reads)?
        if problem := _text_field_problem(options, files, fmt, ctx.config.data.chat.format):
            raise ForgeError(problem)

    problems = _problems(ctx, HFDatasetsOptions, readable)
    if _entries(ctx, HFDatasetsOptions) and importlib.util.find_spec("datasets") is None:
        problems.append(
            f"the hf_datasets source needs the `datasets` package, which is not installed: {hf.EXTRA}"
        )
    return problems


def check_megatron(ctx: Any) -> list[str]:
    from forge_plugins.sources.megatron import read_header

    problems = _problems(ctx, MegatronOptions, lambda options: read_header(options.path))
    return problems + _dtype_problems(
        ctx, MegatronOptions, lambda options: read_header(options.path)["dtype"]
    )


def check_token_file(ctx: Any) -> list[str]:
    from forge_plugins.sources.token_file import check_file

    return _problems(ctx, TokenFileOptions, check_file) + _dtype_problems(ctx, TokenFileOptions, check_file)


def _dtype_problems(ctx: Any, cls: type, dtype_of: Any) -> list[str]:
    """Token files whose integer type cannot hold the configured tokenizer's ids, where
    the vocabulary is known without building the tokenizer (the built-in ``byte``)."""
    entries = _entries(ctx, cls)
    if ctx.config.data.tokenizer != "byte" or not entries:
        return []  # another tokenizer's vocabulary is known when the run builds it (checked there)
    from forge_plugins.tokenizers.byte import ByteTokenizer

    problems = []
    for prefix, options in entries:
        try:
            dtype = dtype_of(options)
        except ForgeError:
            continue  # reported by the file check
        if dtype in ("uint8", "int8"):
            problems.append(
                f"{prefix}$.data.source_options.path: {options.path} holds {dtype} tokens (ids up to "
                f"{255 if dtype == 'uint8' else 127}), but data.tokenizer byte has "
                f"{ByteTokenizer.vocab_size} ids (EOS is {ByteTokenizer.eos_id}): the tokens were not "
                "made by it"
            )
    return problems


def check_shards_directory(ctx: Any) -> list[str]:
    problems = []
    for prefix, options in _entries(ctx, ShardsOptions):
        if not options.path:
            problems.append(
                prefix
                + "data.source_options.path is empty: give the directory written by `forge-run prepare`."
            )
            continue
        try:
            index = read_shard_index(options.path)
        except ForgeError as exc:
            problems.append(prefix + str(exc))
            continue
        made_with = index["tokenizer"]["identity"].partition(":")[0]
        configured = ctx.config.data.tokenizer
        if made_with in _BUILTIN_TOKENIZERS and configured in _BUILTIN_TOKENIZERS and made_with != configured:
            problems.append(
                f"{prefix}{options.path} was tokenized with the {made_with!r} tokenizer, but "
                f"data.tokenizer is {configured!r}: token ids of one mean nothing to the other"
            )
    return problems


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=TEXT_FILES,
            severity="error",
            paths=("data.source", "data.source_options.paths"),
            summary="Every path or glob of the text source matches a non-empty file.",
            check=check_text_files,
            fix="Fix data.source_options.paths (relative to the working directory); a directory "
            "needs a pattern such as 'data/**/*.txt'.",
        ),
        Rule(
            id=CHAT_RECORDS,
            severity="error",
            paths=("data.chat.format", "data.source_options.paths", "data.source_options.text_field"),
            summary="Chat data read by the text source is JSON Lines whose first records have the "
            "fields data.chat.format reads; records with chat fields and no text field are not read "
            "as text without data.chat.format.",
            check=check_chat_records,
            fix="List .jsonl files in data.source_options.paths, and set data.chat.format to the shape "
            "of their records (messages; prompt_completion: prompt and completion; preference: prompt "
            "or messages, chosen, rejected).",
        ),
        Rule(
            id=STDLIB_FILES,
            severity="error",
            paths=("data.source", "data.source_options.max_files", "data.source_options.max_bytes"),
            summary="The stdlib source's limits select at least one file.",
            check=check_stdlib_files,
            fix="Raise data.source_options.max_bytes (0: no limit) or max_files.",
        ),
        Rule(
            id=HF_DATASETS,
            severity="error",
            paths=(
                "data.source",
                "data.source_options.path",
                "data.source_options.data_files",
                "data.source_options.split",
                "data.source_options.text_field",
            ),
            summary="The hf_datasets source's folder or files exist and hold the split and the "
            "text_field, and `datasets` is installed.",
            check=check_hf_datasets,
            fix="Point data.source_options.path at a save_to_disk folder, or data_files at local files; "
            "set data.source_options.text_field to a field the data has (and split to a split of a "
            "saved DatasetDict); install the extra with pip install 'forge-trainer[datasets]'.",
        ),
        Rule(
            id=MEGATRON,
            severity="error",
            paths=("data.source", "data.source_options.path", "data.tokenizer"),
            summary="The megatron source's PREFIX.bin and PREFIX.idx exist, the index has Megatron's "
            "header and sizes, and its token type holds the tokenizer's ids.",
            check=check_megatron,
            fix="Point data.source_options.path at the prefix of a Megatron indexed dataset (PREFIX.bin "
            "and PREFIX.idx, as given to Megatron's --data-path), made with the configured tokenizer.",
        ),
        Rule(
            id=TOKEN_FILE,
            severity="error",
            paths=("data.source", "data.source_options.path", "data.source_options.dtype", "data.tokenizer"),
            summary="The token_file source's file exists and is a 1-D integer .npy, or a raw file of "
            "whole tokens of the declared dtype that holds the tokenizer's ids.",
            check=check_token_file,
            fix="Point data.source_options.path at a .npy array of token ids, or a raw token file with "
            "data.source_options.dtype set to its integer type.",
        ),
        Rule(
            id=SHARDS_DIR,
            severity="error",
            paths=("data.source", "data.source_options.path", "data.tokenizer"),
            summary=(
                "The shards path is a complete `forge-run prepare` output made with the configured tokenizer."
            ),
            check=check_shards_directory,
            fix="Point data.source_options.path at a directory written by `forge-run prepare` "
            "(run it again if it was interrupted), with the tokenizer it was prepared with.",
        ),
    ]
