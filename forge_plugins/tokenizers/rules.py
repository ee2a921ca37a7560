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
    from forge_plugins.tokenizers.hf import options_problem

    return options_problem(options)


def chat_template_problem(ctx: Any) -> str | None:
    """For chat data: the template file exists and compiles, or the tokenizer has one; and
    unless every token trains, the template's generation prompt (or its ``{% generation %}``
    blocks) tells the assistant's header from its answer."""
    chat = ctx.config.data.chat
    if not chat.format or all(entry.name == "shards" for _, entry in ctx.config.data.source_entries()):
        return None  # prepared shards hold rendered conversations already
    from forge_core.api import ForgeError
    from forge_plugins.tokenizers.chat import compile_template, generation_prompt_problem, read_template

    options = ctx.config.data.tokenizer_options
    try:
        if chat.template:
            where = f"data.chat.template: {chat.template}"
            source = read_template(chat.template)
            compile_template(source, where)
        elif isinstance(options, HFOptions):
            from forge_plugins.tokenizers.hf import chat_template_source, tokenizer_dir_problem

            if tokenizer_dir_problem(options.path) is not None:
                return None  # hf.tokenizer-files says why
            where = f"{options.path} (its chat_template)"
            source = chat_template_source(options.path)
            if source is None:
                return (
                    f"data.chat.template is empty and the tokenizer folder {options.path} has no chat "
                    "template (no chat_template in tokenizer_config.json, no chat_template.jinja)"
                )
        elif ctx.config.data.tokenizer == "byte":
            return "data.chat.template is empty, and the byte tokenizer has no chat template of its own"
        else:
            return None
        if chat.loss == "all" and chat.format != "preference":
            return None  # every token trains: no span to find
        return generation_prompt_problem(source, where)
    except ForgeError as exc:
        return str(exc)


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
        Rule(
            id=CHAT_TEMPLATE,
            severity="error",
            paths=("data.chat.format", "data.chat.template", "data.chat.loss", "data.tokenizer"),
            summary="Chat data has a chat template (data.chat.template names a valid Jinja file, or the "
            "tokenizer folder has its own) whose generation prompt or {% generation %} blocks tell the "
            "assistant's header from its answer.",
            check=chat_template_problem,
            fix="Set data.chat.template to a Jinja chat template file (the tokenizer's own, saved as "
            "chat_template.jinja, or one you write), or use a tokenizer folder that has one; give it an "
            "{% if add_generation_prompt %} branch that writes the assistant's header, or "
            "{% generation %} blocks around the answers.",
        ),
    ]
