"""Registers the built-in tokenizers and their rules. Imports nothing heavy: it runs for
``forge-run check``."""

from __future__ import annotations

from forge_core.api import TokenizerSpec, hookimpl
from forge_plugins.tokenizers.options import HFOptions


@hookimpl
def forge_tokenizers() -> list[TokenizerSpec]:
    return [
        TokenizerSpec(
            name="byte",
            summary="UTF-8 bytes: ids 0-255, EOS 256, PAD 257; needs no files",
            impl="forge_plugins.tokenizers.byte:ByteTokenizer",
        ),
        TokenizerSpec(
            name="hf",
            summary="A Hugging Face tokenizer from a local directory or a Hub id (AutoTokenizer)",
            impl="forge_plugins.tokenizers.hf:HFTokenizer",
            options=HFOptions,
            fetch="forge_plugins.tokenizers.hf:fetch",
        ),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.tokenizers.rules import rules

    return rules()
