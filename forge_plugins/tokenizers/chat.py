"""Chat templates rendered to token ids with a trainable mask: what the built-in
tokenizers' ``encode_chat`` computes.

A template is Jinja, rendered the way ``transformers`` renders ``apply_chat_template``
(a sandboxed environment, ``trim_blocks`` and ``lstrip_blocks``, ``raise_exception``,
``strftime_now``, ``tojson``, the ``{% generation %}`` block), under the limits of
memory, steps, time and output size of :mod:`forge_plugins.tokenizers.sandbox`. A
template file is read only if it is a regular file of at most :data:`TEMPLATE_BYTES`.
Which characters take a loss:

- the template marks them with ``{% generation %} ... {% endgeneration %}`` (what
  transformers' ``return_assistant_tokens_mask`` reads): those spans;
- otherwise every assistant message's span is found by rendering prefixes: message
  ``k`` spans from the end of the rendering of messages ``[:k]`` with the generation
  prompt to the end of the rendering of ``[:k + 1]``. That is sound only when the
  generation prompt is the assistant's header (rendering ``[:k]`` with it must add
  something: a template without an ``add_generation_prompt`` branch would have the
  header, ``<|im_start|>assistant\n``, trained as answer text, so it is refused with the
  fix) and the template is *prefix-stable* (each of those renderings is the start of the
  whole conversation's); when it is not (a template that rewrites earlier turns, such as
  one that drops past reasoning), the record is refused with the message index, never
  guessed.

Only spans from message ``train_from`` on count (a pair's prompt never trains; with
``train_from`` past the last message nothing is looked for, which ``data.chat.loss: all``
uses, so any template renders). A token
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
from forge_plugins.tokenizers.sandbox import Limits

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")

#: The largest template file read (published templates are tens of kilobytes).
TEMPLATE_BYTES = 1 << 20

#: What the fix of a template without a generation prompt shows.
GENERATION_SNIPPET = (
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %} at the end (the assistant's "
    "header, as your template writes it), or {% generation %}{{ message.content }}{% endgeneration %} "
    "around the assistant's content"
)

# What a template's code may raise on a record besides jinja2's errors (a Python error in
# an expression, a recursion without end): the template's fault, not Forge's.
_RENDER_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError, RecursionError)


class ChatTemplate:
    """A compiled chat template; ``where`` names it in errors (a file, or a tokenizer
    folder's ``chat_template``)."""

    def __init__(
        self,
        source: str,
        where: str,
        variables: dict[str, Any] | None = None,
        limits: Limits = Limits(),
    ) -> None:
        self.where = where
        self.source = source
        self.marks_generation = bool(GENERATION.search(source))
        self.variables = dict(variables or {})
        self.template = compile_template(source, where, limits)

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool
    ) -> tuple[str, list[tuple[int, int]]]:
        """The text and the character spans of its ``{% generation %}`` blocks."""
        from jinja2.exceptions import TemplateError

        from forge_plugins.tokenizers.sandbox import RenderLimit

        spans: list[tuple[int, int]] = []
        blocks: list[str] = []
        size = 0  # characters rendered so far
        env = self.template.environment
        limit = env.limits.size

        def generation(caller: Callable[[], str]) -> str:
            text = caller()
            spans.append((size, size + len(text)))
            return text

        env.start()
        try:
            for block in self.template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                _generation=generation,
                **self.variables,
            ):
                size += len(block)
                if size > limit:
                    env.bound(size, "the rendering")
                blocks.append(block)
        except RenderLimit as exc:
            raise ForgeError(
                f"{self.where}: the chat template was stopped on a record: {exc}. A chat template "
                "renders one conversation: fix the template (a loop or a value that grows without end), "
                "or leave the record out if it is that large."
            ) from None
        except TemplateError as exc:
            raise ForgeError(f"{self.where}: the chat template fails on a record ({exc}).") from None
        except _RENDER_ERRORS as exc:
            raise ForgeError(
                f"{self.where}: the chat template fails on a record ({type(exc).__name__}: {exc})."
            ) from None
        return "".join(blocks), spans


def read_template(path: str) -> str:
    """The text of the template file ``path`` (``data.chat.template``), or a ForgeError:
    a regular file (a FIFO or a device would block or never end) of at most
    :data:`TEMPLATE_BYTES`."""
    from forge_core.api.unstable import FileRefused, read_small_text

    try:
        return read_small_text(path, TEMPLATE_BYTES, "the chat template")
    except FileRefused as exc:
        raise ForgeError(f"data.chat.template: {exc}.") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ForgeError(
            f"data.chat.template: cannot read {path!r} ({reason}). Give a Jinja chat template file."
        ) from None


def compile_template(source: str, where: str, limits: Limits = Limits()) -> Any:
    """``source`` compiled in transformers' environment (bounded by ``limits``), or a
    ForgeError naming ``where``."""
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols

    from forge_plugins.tokenizers.sandbox import BoundedSandbox

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

    env = BoundedSandbox(
        limits,
        filters={"tojson": tojson},
        # Templates that print today's date (Llama 3's) call it; transformers defines it too.
        globals={
            "strftime_now": lambda fmt: datetime.now().strftime(fmt),
            "raise_exception": raise_exception,
        },
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Generation, loopcontrols],
    )
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
    if train_from >= len(messages):
        return text, []  # nothing may train (data.chat.loss: all then trains every token)
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
        if before == template.render(messages[:k], False)[0]:
            raise no_generation_prompt(template, k)
        upto, _ = template.render(messages[: k + 1], False)
        if not (upto.startswith(before) and text.startswith(upto)):
            raise unstable(template, k, "the messages before it")
        spans.append((len(before), len(upto)))
    return text, spans


def generation_prompt_problem(source: str, where: str) -> str | None:
    """What ``forge-run check`` says of a template that cannot tell the assistant's header
    from its answer (:func:`no_generation_prompt`), judged on a one-message conversation;
    ``None`` when it can, or when that conversation does not render (the records decide)."""
    template = ChatTemplate(source, where)
    if template.marks_generation:
        return None
    probe = [{"role": "user", "content": "Hi"}]
    try:
        if template.render(probe, True)[0] != template.render(probe, False)[0]:
            return None
    except ForgeError:
        return None
    return str(no_generation_prompt(template, 1))


def no_generation_prompt(template: ChatTemplate, k: int) -> ForgeError:
    return ForgeError(
        f"{template.where}: the chat template writes nothing for add_generation_prompt (rendering the "
        f"messages before message {k} with it gives the same text as without), so the assistant's "
        "header would be trained as answer text, and the template has no {% generation %} block to "
        f"say where the answer starts. Add {GENERATION_SNIPPET}."
    )


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
