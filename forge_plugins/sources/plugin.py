"""Registers the built-in sources and their rules. Imports nothing heavy: it runs for
``forge-run check``."""

from __future__ import annotations

from forge_core.api import SourceSpec, hookimpl
from forge_plugins.sources.options import (
    HFDatasetsOptions,
    MegatronOptions,
    ShardsOptions,
    StdlibOptions,
    TextOptions,
    TokenFileOptions,
)


@hookimpl
def forge_sources() -> list[SourceSpec]:
    return [
        SourceSpec(
            name="text",
            summary="Text (.txt) and JSON Lines (.jsonl) files matched by glob patterns",
            impl="forge_plugins.sources.text:TextSource",
            options=TextOptions,
        ),
        SourceSpec(
            name="shards",
            summary="Pre-tokenized shards written by `forge-run prepare`",
            impl="forge_plugins.sources.shards:ShardSource",
            options=ShardsOptions,
            pretokenized=True,
        ),
        SourceSpec(
            name="megatron",
            summary="A Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx), memory-mapped in place",
            impl="forge_plugins.sources.megatron:MegatronSource",
            options=MegatronOptions,
            pretokenized=True,
        ),
        SourceSpec(
            name="token_file",
            summary="A flat token file (.npy, or raw .bin with a dtype), documents split at EOS",
            impl="forge_plugins.sources.token_file:TokenFileSource",
            options=TokenFileOptions,
            pretokenized=True,
        ),
        SourceSpec(
            name="hf_datasets",
            summary=(
                "A text column of a local Hugging Face `datasets` data set "
                "(saved folder, Parquet, JSON, Arrow)"
            ),
            impl="forge_plugins.sources.hf_datasets:HFDatasetsSource",
            options=HFDatasetsOptions,
            streaming_option="streaming",
        ),
        SourceSpec(
            name="stdlib",
            summary="Python standard library .py files (no tests or site-packages), sorted; no download",
            impl="forge_plugins.sources.stdlib:StdlibSource",
            options=StdlibOptions,
        ),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.sources.rules import rules

    return rules()
