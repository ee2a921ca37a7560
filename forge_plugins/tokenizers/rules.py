"""Rules of the built-in tokenizers: what ``forge-run check`` can see of a tokenizer
folder without importing transformers. The rule calls the check the ``hf`` tokenizer runs
when it is built, so both refuse the same folders with the same words; a rule rather
than a validator because it judges this machine's file system, not the value."""

from __future__ import annotations

from typing import Any

from forge_plugins.tokenizers.options import HFOptions

HF_FILES = "hf.tokenizer-files"


def check_hf_files(ctx: Any) -> str | None:
    options = ctx.config.data.tokenizer_options
    if not isinstance(options, HFOptions):
        return None
    from forge_plugins.tokenizers.hf import options_problem

    return options_problem(options)


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=HF_FILES,
            severity="error",
            paths=("data.tokenizer", "data.tokenizer_options.path", "data.tokenizer_options.revision"),
            summary="The hf tokenizer's path is a folder (or a cached Hub id) holding a tokenizer's files.",
            check=check_hf_files,
            fix="Point data.tokenizer_options.path at a folder written by save_pretrained or by "
            "`forge-run prepare --train-bpe`, or download the Hub id with the command the message gives.",
        ),
    ]
