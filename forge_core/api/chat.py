"""Chat records, the shapes users have, as conversations a chat template renders.

``data.chat.format`` says which shape a source's records have (the field names are the
ones TRL and most published data sets use):

- ``messages``: ``{"messages": [{"role": ..., "content": ...}, ...]}``, every assistant
  turn trained;
- ``prompt_completion``: ``{"prompt": ..., "completion": ...}``, each a string (the
  prompt becomes one user turn, the completion one assistant turn) or a messages list;
  the completion is trained;
- ``preference``: ``{"prompt" or "messages": ..., "chosen": ..., "rejected": ...}``,
  the prompt as above (a messages list in ``messages``), ``chosen`` and ``rejected``
  each a string (one assistant turn) or a messages list: one unit of two conversations,
  prompt + chosen then prompt + rejected, only the completions trained.

A message's ``content`` is a string, or a list of text parts ``{"type": "text", "text":
...}`` (read as their texts joined), or ``null`` beside ``tool_calls``; anything else is
refused naming the record and the message (:func:`_message_content`).

:func:`conversation` turns a record into a :class:`Conversation`; its errors say which
field is missing or malformed, and how it should look. Torch-free and numpy-free: the
checks of ``forge-run check`` use the same field lists (:data:`FIELDS`).
"""

from __future__ import annotations

from typing import Any

import attrs

from forge_core.api.errors import ForgeError

#: The fields each format needs; a tuple of alternatives is "one of these".
FIELDS: dict[str, tuple[Any, ...]] = {
    "messages": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "preference": (("prompt", "messages"), "chosen", "rejected"),
}


@attrs.frozen
class Conversation:
    """What a record renders as: ``messages`` (the whole conversation; for a pair, the
    prompt then the chosen completion), the index of the first message that may take a
    loss (``train_from``: 0 for ``messages``, the prompt's length otherwise) and, for a
    pair, the ``rejected`` conversation (the same prompt, the rejected completion)."""

    messages: list[dict[str, Any]]
    train_from: int = 0
    rejected: list[dict[str, Any]] | None = None


def missing_fields(fmt: str, fields: list[str]) -> list[str]:
    """The fields of ``FIELDS[fmt]`` absent from ``fields`` (an alternative as
    ``'prompt' or 'messages'``)."""
    out = []
    for need in FIELDS[fmt]:
        options = need if isinstance(need, tuple) else (need,)
        if not any(o in fields for o in options):
            out.append(" or ".join(repr(o) for o in options))
    return out


def format_of(fields: list[str]) -> str | None:
    """The ``data.chat.format`` whose fields ``fields`` holds (a pair first: it has a
    prompt too), or ``None``."""
    return next(
        (fmt for fmt in ("preference", "prompt_completion", "messages") if not missing_fields(fmt, fields)),
        None,
    )


def chat_hint(fields: list[str]) -> str:
    """For text read from records that have no text field: the sentence that says they
    are chat data and which ``data.chat.format`` reads them, or ``""``."""
    fmt = format_of(fields)
    if fmt is None:
        return ""
    return (
        f" These records have the fields of chat data ({_fields_doc(fmt)}): set data.chat.format: {fmt} "
        "to render them with a chat template (data.chat.template, or the tokenizer's own)."
    )


def _messages(value: Any, field: str, where: str, role: str | None = None) -> list[dict[str, Any]]:
    """A messages list from a record field: a string becomes one turn of ``role``."""
    if isinstance(value, str) and role is not None:
        return [{"role": role, "content": value}]
    shape = "a string or a list" if role is not None else "a list"
    if not isinstance(value, list) or not value:
        raise ForgeError(
            f"{where}: field {field!r} is {_what(value)}; it must be {shape} of messages like "
            '[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}].'
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ForgeError(
                f"{where}: {field}[{i}] is {_what(m)}; every message is an object with a string "
                '"role" and a "content", like {"role": "user", "content": "Hi"}.'
            )
        out.append({**m, "content": _message_content(m, f"{where}: {field}[{i}].content")})
    return out


def _message_content(message: dict[str, Any], where: str) -> str | None:
    """A message's content as the template receives it: a string; a list of text parts
    (``{"type": "text", "text": ...}``, transformers' multimodal shape) as their texts
    joined, which is how templates that take parts print them; ``null`` only beside
    ``tool_calls`` (an assistant turn that only calls a tool). Anything else (a number,
    ``null``, ``NaN``, an image part) would be printed as the text "5", "None", "nan" or a
    Python repr and trained: refused."""
    content = message["content"]
    if isinstance(content, str) or (content is None and message.get("tool_calls")):
        return content
    if isinstance(content, list) and content:
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                found = f"a part of type {kind!r}" if isinstance(kind, str) else _what(part)
                raise ForgeError(
                    f"{where}[{j}] is {found}; Forge trains on text, so a content list may hold only "
                    'text parts, {"type": "text", "text": "..."}. Keep the text, or leave the record out.'
                )
        return "".join(part["text"] for part in content)
    raise ForgeError(
        f"{where} is {_what(content)}, not a string: it would be trained as the text "
        f"{str(content)!r}. Give the message's text as a string (or a list of "
        '{"type": "text", "text": "..."} parts), or leave the record out.'
    )


def _what(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def conversation(record: Any, fmt: str, where: str) -> Conversation:
    """The conversation of one ``record`` of format ``fmt``; ``where`` (file and line,
    or data set and row) starts every error."""
    if not isinstance(record, dict):
        raise ForgeError(f"{where}: a {fmt} record is an object with fields, got {_what(record)}.")
    absent = missing_fields(fmt, list(record))
    if absent:
        raise ForgeError(
            f"{where}: no field {', '.join(absent)} (fields: {', '.join(map(str, record)) or 'none'}); "
            f"data.chat.format {fmt!r} reads {_fields_doc(fmt)}."
        )
    if fmt == "messages":
        messages = _messages(record["messages"], "messages", where)
        if not any(m["role"] == "assistant" for m in messages):
            raise ForgeError(
                f"{where}: the conversation has no assistant message, so nothing would take a loss. "
                "Remove the record or add the assistant's answer."
            )
        return Conversation(messages)
    field = "prompt" if "prompt" in record else "messages"
    prompt = _messages(record[field], field, where, role="user")
    if fmt == "prompt_completion":
        completion = _messages(record["completion"], "completion", where, role="assistant")
        return Conversation(prompt + completion, len(prompt))
    chosen = _messages(record["chosen"], "chosen", where, role="assistant")
    rejected = _messages(record["rejected"], "rejected", where, role="assistant")
    return Conversation(prompt + chosen, len(prompt), prompt + rejected)


def _fields_doc(fmt: str) -> str:
    return ", ".join(" or ".join(n) if isinstance(n, tuple) else n for n in FIELDS[fmt])
