"""Rules of the built-in sources: what ``forge-run check`` can see of their files without
reading a document. Each calls the function the source itself runs when it is built
(``resolve`` of the text source, the stdlib file selection, the shard index reader), so
check and build refuse the same inputs with the same words. They are rules, not option
validators, because they judge the file system of the machine that checks or trains,
not the value itself (the same options are read back later from a run directory)."""

from __future__ import annotations

from typing import Any

from forge_core.api import ForgeError
from forge_plugins.sources.options import ShardsOptions, StdlibOptions, TextOptions

TEXT_FILES = "text.files-exist"
SHARDS_DIR = "shards.directory"
STDLIB_FILES = "stdlib.files-selected"

#: Built-in tokenizers and the prefix of the identity each writes into a shard index.
_BUILTIN_TOKENIZERS = ("byte", "hf")


def _options(ctx: Any, cls: type) -> Any:
    options = ctx.config.data.source_options
    return options if isinstance(options, cls) else None


def _problem(build: Any) -> str | None:
    try:
        build()
    except ForgeError as exc:
        return str(exc)
    return None


def check_text_files(ctx: Any) -> str | None:
    options = _options(ctx, TextOptions)
    if options is None:
        return None
    from forge_plugins.sources.text import resolve

    return _problem(lambda: resolve(options.paths))


def check_stdlib_files(ctx: Any) -> str | None:
    options = _options(ctx, StdlibOptions)
    if options is None:
        return None
    from forge_plugins.sources.stdlib import StdlibSource

    return _problem(lambda: StdlibSource(options))


def check_shards_directory(ctx: Any) -> list[str]:
    options = _options(ctx, ShardsOptions)
    if options is None:
        return []
    if not options.path:
        return ["data.source_options.path is empty: give the directory written by `forge-run prepare`."]
    from forge_core.data.shard_index import read_index

    try:
        index = read_index(options.path)
    except ForgeError as exc:
        return [str(exc)]
    made_with = index["tokenizer"]["identity"].partition(":")[0]
    configured = ctx.config.data.tokenizer
    if made_with in _BUILTIN_TOKENIZERS and configured in _BUILTIN_TOKENIZERS and made_with != configured:
        return [
            f"{options.path} was tokenized with the {made_with!r} tokenizer, but data.tokenizer is "
            f"{configured!r}: token ids of one mean nothing to the other"
        ]
    return []


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
            id=STDLIB_FILES,
            severity="error",
            paths=("data.source", "data.source_options.max_files", "data.source_options.max_bytes"),
            summary="The stdlib source's limits select at least one file.",
            check=check_stdlib_files,
            fix="Raise data.source_options.max_bytes (0: no limit) or max_files.",
        ),
        Rule(
            id=SHARDS_DIR,
            severity="error",
            paths=("data.source", "data.source_options.path", "data.tokenizer"),
            summary="The shards path is a complete `forge-run prepare` output made with the configured tokenizer.",
            check=check_shards_directory,
            fix="Point data.source_options.path at a directory written by `forge-run prepare` "
            "(run it again if it was interrupted), with the tokenizer it was prepared with.",
        ),
    ]
