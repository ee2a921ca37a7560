"""Rules of the built-in tokenizers: what ``forge-run check`` can see of a tokenizer
folder without importing transformers. The rule calls the check the ``hf`` tokenizer runs
when it is built, so both refuse the same folders with the same words; a rule rather
than a validator because it judges this machine's file system, not the value."""

from __future__ import annotations

from typing import Any

from forge_plugins.tokenizers.options import HFOptions

HF_FILES = "hf.tokenizer-files"
CHAT_TEMPLATE = "chat.template"


def check_hf_files(ctx: Any) -> str | None:
    options = ctx.config.data.tokenizer_options
    if not isinstance(options, HFOptions):
        return None
    from forge_plugins.tokenizers.hf import tokenizer_dir_problem

    return tokenizer_dir_problem(options.path)


def chat_template_problem(ctx: Any) -> str | None:
    """For chat data: the template file exists and compiles, or the tokenizer has one."""
    chat = ctx.config.data.chat
    if not chat.format or all(entry.name == "shards" for _, entry in ctx.config.data.source_entries()):
        return None  # prepared shards hold rendered conversations already
    from forge_core.api import ForgeError
    from forge_plugins.tokenizers.chat import compile_template, read_template

    if chat.template:
        try:
            compile_template(read_template(chat.template), f"data.chat.template: {chat.template}")
        except ForgeError as exc:
            return str(exc)
        return None
    options = ctx.config.data.tokenizer_options
    if isinstance(options, HFOptions):
        from forge_plugins.tokenizers.hf import chat_template_source, tokenizer_dir_problem

        if tokenizer_dir_problem(options.path) is None and chat_template_source(options.path) is None:
            return (
                f"data.chat.template is empty and the tokenizer folder {options.path} has no chat "
                "template (no chat_template in tokenizer_config.json, no chat_template.jinja)"
            )
        return None
    if ctx.config.data.tokenizer == "byte":
        return "data.chat.template is empty, and the byte tokenizer has no chat template of its own"
    return None


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=HF_FILES,
            severity="error",
            paths=("data.tokenizer", "data.tokenizer_options.path"),
            summary="The hf tokenizer's path is a folder holding a tokenizer's files.",
            check=check_hf_files,
            fix="Point data.tokenizer_options.path at a folder written by save_pretrained or by "
            "`forge-run prepare --train-bpe`.",
        ),
        Rule(
            id=CHAT_TEMPLATE,
            severity="error",
            paths=("data.chat.format", "data.chat.template", "data.tokenizer"),
            summary="Chat data has a chat template: data.chat.template names a valid Jinja file, or "
            "the tokenizer folder has its own.",
            check=chat_template_problem,
            fix="Set data.chat.template to a Jinja chat template file (the tokenizer's own, saved as "
            "chat_template.jinja, or one you write), or use a tokenizer folder that has one.",
        ),
    ]
