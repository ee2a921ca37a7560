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
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ForgeError(
                f"{where}: {field}[{i}] is {_what(m)}; every message is an object with a string "
                '"role" and a "content", like {"role": "user", "content": "Hi"}.'
            )
    return [dict(m) for m in value]


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
