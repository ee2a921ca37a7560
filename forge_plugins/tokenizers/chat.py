"""Chat templates rendered to token ids with a trainable mask: what the built-in
tokenizers' ``encode_chat`` computes.

A template is Jinja, rendered the way ``transformers`` renders ``apply_chat_template``
(a sandboxed environment, ``trim_blocks`` and ``lstrip_blocks``, ``raise_exception``,
``strftime_now``, ``tojson``, the ``{% generation %}`` block). Which characters take a loss:

- the template marks them with ``{% generation %} ... {% endgeneration %}`` (what
  transformers' ``return_assistant_tokens_mask`` reads): those spans;
- otherwise every assistant message's span is found by rendering prefixes: message
  ``k`` spans from the end of the rendering of messages ``[:k]`` with the generation
  prompt to the end of the rendering of ``[:k + 1]``. That is sound only when the
  template is *prefix-stable* (each of those renderings is the start of the whole
  conversation's); when it is not (a template that rewrites earlier turns, such as one
  that drops past reasoning), the record is refused with the message index, never
  guessed.

Only spans from message ``train_from`` on count (a pair's prompt never trains). A token
takes a loss when its first character lies in a span (a token that straddles a span's
start belongs to what comes before it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np

from forge_core.api import ForgeError, MaskedDocument

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatTemplate:
    """A compiled chat template; ``where`` names it in errors (a file, or a tokenizer
    folder's ``chat_template``)."""

    def __init__(self, source: str, where: str, variables: dict[str, Any] | None = None) -> None:
        self.where = where
        self.source = source
        self.marks_generation = bool(GENERATION.search(source))
        self.variables = dict(variables or {})
        self.template = compile_template(source, where)

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool
    ) -> tuple[str, list[tuple[int, int]]]:
        """The text and the character spans of its ``{% generation %}`` blocks."""
        from jinja2.exceptions import TemplateError

        spans: list[tuple[int, int]] = []
        blocks: list[str] = []

        def generation(caller: Callable[[], str]) -> str:
            text = caller()
            start = len("".join(blocks))
            spans.append((start, start + len(text)))
            return text

        try:
            for block in self.template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                _generation=generation,
                **self.variables,
            ):
                blocks.append(block)
        except TemplateError as exc:
            raise ForgeError(f"{self.where}: the chat template fails on a record ({exc}).") from None
        return "".join(blocks), spans


def read_template(path: str) -> str:
    """The text of the template file ``path`` (``data.chat.template``), or a ForgeError."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ForgeError(
            f"data.chat.template: cannot read {path!r} ({reason}). Give a Jinja chat template file."
        ) from None


def compile_template(source: str, where: str) -> Any:
    """``source`` compiled in transformers' environment, or a ForgeError naming ``where``."""
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}``: calls ``_generation(caller)``, which records the span."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = nodes.Call(nodes.Name("_generation", "load"), [], [], None, None)
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env.filters["tojson"] = tojson
    # Templates that print today's date (Llama 3's) call it; transformers defines it too.
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except TemplateError as exc:
        line = f", line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise ForgeError(f"{where}{line}: not a valid Jinja chat template ({exc.message or exc}).") from None


def trained_spans(
    template: ChatTemplate, messages: list[dict[str, Any]], train_from: int
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans that take a loss."""
    text, marked = template.render(messages, False)
    start = 0
    if train_from:
        prompt, _ = template.render(messages[:train_from], True)
        if not text.startswith(prompt):
            raise unstable(template, train_from, "the prompt with the generation prompt")
        start = len(prompt)
    if template.marks_generation:
        spans = [(max(a, start), b) for a, b in marked if b > start]
        if not spans:
            raise ForgeError(
                f"{template.where}: the template's {{% generation %}} blocks mark nothing of the "
                "answer in a record, so no token would take a loss. Put the assistant's content "
                "inside {% generation %} ... {% endgeneration %}."
            )
        return text, spans
    spans = []
    for k, message in enumerate(messages):
        if k < train_from or message["role"] != "assistant":
            continue
        before, _ = template.render(messages[:k], True)
        upto, _ = template.render(messages[: k + 1], False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise unstable(template, k, "the messages before it")
        spans.append((len(before), len(upto)))
    return text, spans


def unstable(template: ChatTemplate, k: int, what: str) -> ForgeError:
    return ForgeError(
        f"{template.where}: the chat template is not prefix-stable: rendering {what} (message {k}) "
        "does not give the start of the whole conversation's rendering, so the assistant's tokens "
        "cannot be found safely. Mark the assistant's content in the template with "
        "{% generation %} ... {% endgeneration %}, or give a prefix-stable template in "
        "data.chat.template, or train on every token (data.chat.loss: all)."
    )


def encode_chat(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    train_from: int,
    encode: Callable[[str], tuple[Any, Any]],
) -> MaskedDocument:
    """``messages`` rendered by ``template`` and encoded by ``encode(text) -> (ids, the
    character index where each token starts)``, with the mask of :func:`trained_spans`."""
    text, spans = trained_spans(template, messages, train_from)
    ids, starts = encode(text)
    starts = np.asarray(starts, np.int64)
    trainable = np.zeros(len(starts), bool)
    for a, b in spans:
        trainable |= (starts >= a) & (starts < b)
    return MaskedDocument(np.asarray(ids, np.int64), trainable)
