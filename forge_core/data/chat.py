"""Chat and preference data (``data.chat``): a source's records rendered by the chat
template into masked documents, and the rows' stream of them, truncated by a counted
policy.

:class:`ChatDocuments` stands in for the source in the token cache: its ``documents()``
are the records (``source.records()``, ``(where, record)`` pairs) turned into
conversations (:func:`forge_core.api.chat.conversation`) and encoded by the tokenizer's
``encode_chat(messages, train_from=..., template=...)`` into a
:class:`~forge_core.api.MaskedDocument`. A preference record becomes two stored
documents, the chosen conversation with its EOS stored after it, then the rejected
one: the stream reads the two as ONE unit (``prompt+chosen EOS prompt+rejected EOS``)
that no packer can split, two documents to attention (positions restart after the inner
EOS, whose label is -100). Its fingerprint is the source's plus the chat settings and
the template (``tokenizer.chat_identity(template)``), so another template is another
cache entry; every stored document hashes its record's JSON (the held-out split keeps
a pair's two halves together and does not depend on the tokenizer). An error of the
template (it fails, is stopped at a bound, or cannot tell the answer from its header)
names the record it was rendering; with ``data.chat.loss: all`` no assistant span is
looked for (``train_from`` past the last message), so any template renders.

A pair that cannot teach (:class:`DegeneratePairs`): chosen and rejected render to the
same tokens (the margin is 0 whatever the model), or a completion is empty (every
completion message's content blank), which is most often a field read wrongly. Some
are a warning with their count and the first record; all of them a ForgeError, since
the run would learn nothing from its data.

:func:`chat_stream` makes the packer's stream and applies ``data.chat.truncation`` to
units longer than ``data.seq_len`` (EOS included): ``drop`` leaves them out,
``cut_prompt`` cuts untrained tokens from the left of a conversation until it fits
(dropping it when its first trained token would go); never a silent cut of an answer.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np

from forge_core.api import (
    ChatTokenizer,
    FileFingerprintedSource,
    FileSet,
    ForgeError,
    MaskedDocument,
    RecordSource,
)
from forge_core.api.chat import conversation


def _content(record: Any) -> bytes:
    return json.dumps(record, sort_keys=True, ensure_ascii=False, default=str).encode(
        "utf-8", "surrogatepass"
    )


class ChatDocuments:
    """The chat records of ``source`` as masked documents (see the module docstring)."""

    def __init__(self, source: Any, tokenizer: Any, chat: Any) -> None:
        if not isinstance(source, RecordSource):
            raise ForgeError(
                f"{source.describe()}: data.chat.format is {chat.format!r}, but this source yields text, "
                "not records. Read chat data with a source that has records (text over .jsonl files, "
                "hf_datasets)."
            )
        if not isinstance(tokenizer, ChatTokenizer):
            raise ForgeError(
                f"the tokenizer {tokenizer.identity} has no encode_chat, so it cannot render chat "
                "records. Use the hf or byte tokenizer, or set data.chat.format: ''."
            )
        self.source = source
        self.tokenizer = tokenizer
        self.chat = chat
        self.template = chat.template or None
        self.settings = {
            "format": chat.format,
            "loss": chat.loss,
            "template": tokenizer.chat_identity(self.template)
            if callable(getattr(tokenizer, "chat_identity", None))
            else self.template,
        }
        if isinstance(source, FileFingerprintedSource):
            self.fingerprint_files = self._files  # the cache's manifest then hashes the files once

    def describe(self) -> str:
        return f"{self.source.describe()}, as {self.chat.format} chat records"

    def _files(self) -> FileSet:
        files = self.source.fingerprint_files()
        return FileSet(files.kind, files.files, {**files.settings, "chat": self.settings})

    def fingerprint(self) -> str:
        from forge_core.data.fingerprint import source_fingerprint

        h = hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode())
        h.update(source_fingerprint(self.source).encode())
        return f"chat:{h.hexdigest()}"

    def documents(self) -> Iterator[MaskedDocument]:
        fmt, every = self.chat.format, self.chat.loss == "all" and self.chat.format != "preference"
        encode, template, eos = self.tokenizer.encode_chat, self.template, int(self.tokenizer.eos_id)
        found, degenerate = 0, DegeneratePairs()
        for where, record in self.source.records():
            talk = conversation(record, fmt, where)
            content = _content(record)
            try:  # the template's errors name the template; the record is named here
                # loss: all needs no assistant span, so any template renders.
                start = len(talk.messages) if every else talk.train_from
                first = encode(talk.messages, train_from=start, template=template)
                second = None
                if talk.rejected is not None:
                    second = encode(talk.rejected, train_from=talk.train_from, template=template)
            except ForgeError as exc:
                raise ForgeError(f"{where}: {exc}") from None
            if every:
                first = MaskedDocument(first.ids, np.ones(len(first.ids), bool))
            found += 1
            if second is None:
                yield MaskedDocument(first.ids, first.trainable, content)
                continue
            degenerate.see(where, talk, first.ids, second.ids)
            # The chosen half keeps its EOS: the pair is one stored unit, split at it.
            ends = bool(first.trainable[-1]) if len(first) else True
            yield MaskedDocument(np.append(first.ids, eos), np.append(first.trainable, ends), content)
            yield MaskedDocument(second.ids, second.trainable, content)
        if not found:
            raise ForgeError(f"{self.source.describe()}: no record to read as {fmt} chat data.")
        degenerate.judge(self.source.describe(), found)


def _blank(messages: list[dict[str, Any]]) -> bool:
    return all(isinstance(m.get("content"), str) and not m["content"].strip() for m in messages)


@attrs.define
class DegeneratePairs:
    """The preference pairs of a source that cannot teach (module docstring): counted as
    the records are read, then judged."""

    identical: int = 0
    empty: int = 0
    first: str = ""

    def see(self, where: str, talk: Any, chosen: np.ndarray, rejected: np.ndarray) -> None:
        """Count the pair of record ``where``: ``talk`` (its conversation) rendered to
        ``chosen`` and ``rejected`` tokens."""
        if np.array_equal(chosen, rejected):
            self.identical += 1
        elif _blank(talk.messages[talk.train_from :]) or _blank(talk.rejected[talk.train_from :]):
            self.empty += 1
        else:
            return
        self.first = self.first or where

    def judge(self, source: str, pairs: int) -> None:
        """A ForgeError when none of ``pairs`` can teach, a warning when some cannot."""
        bad = self.identical + self.empty
        if not bad:
            return
        what = (
            f"{self.identical:,} with the same chosen and rejected completion (they teach nothing), "
            f"{self.empty:,} with an empty completion; the first is {self.first}"
        )
        if bad == pairs:
            raise ForgeError(
                f"{source}: none of its {pairs:,} preference pairs can teach: {what}. DPO learns from the "
                "difference between the chosen and the rejected completion: check that the records' "
                "'chosen' and 'rejected' fields hold the two different answers, or fix the data."
            )
        print(
            f"warning: {source}: {bad:,} of {pairs:,} preference pairs cannot teach: {what}. They are "
            "trained on, with no effect or a suspicious one; remove or fix them.",
            file=sys.stderr,
            flush=True,
        )


def chat_source(source: Any, tokenizer: Any, chat: Any) -> Any:
    """``source`` as the token cache reads it: its chat records rendered when
    ``data.chat.format`` is set (a source that already holds tokens, prepared shards,
    is read as it is)."""
    if not chat.format or getattr(source, "shards", None) is not None:
        return source
    return ChatDocuments(source, tokenizer, chat)


@attrs.frozen
class Truncation:
    """What ``data.chat.truncation`` did to a source's units."""

    units: int
    too_long: int
    dropped: int
    cut: int

    def note(self, seq_len: int, fmt: str) -> str:
        """The data summary's words for it (``fmt``: ``data.chat.format``)."""
        what = "pairs" if fmt == "preference" else "conversations"
        line = f"chat: {self.units:,} {what}"
        if self.too_long:
            line += (
                f", {self.too_long:,} longer than seq_len {seq_len}: {self.dropped:,} dropped, "
                f"{self.cut:,} cut from the left of their prompt"
            )
        return line


def chat_stream(
    shards: Any, documents: np.ndarray, eos_id: int, vocab_size: int, chat: Any, seq_len: int
) -> tuple[Any, Truncation]:
    """The packer's stream over the chat units among ``documents`` (shard document
    numbers, a pair's two halves next to each other), truncated by ``chat.truncation``."""
    from forge_core.data.packed_rows import DocumentStream

    documents = np.asarray(documents, np.int64)
    starts, counts = shards.starts[documents], shards.counts[documents]
    inner = None
    if chat.format == "preference":
        first, second = documents[0::2], documents[1::2]
        if len(first) != len(second) or np.any(second != first + 1):
            raise ForgeError(
                f"{shards.path}: preference data is stored as chosen/rejected document pairs, but "
                "these shards do not hold whole pairs. Tokenize the source again (delete the entry)."
            )
        documents, inner = first, counts[0::2] - 1
        starts, counts = starts[0::2], counts[0::2] + counts[1::2]
    fits = counts + 1 <= seq_len
    long = np.flatnonzero(~fits)
    cut = 0
    if long.size and chat.truncation == "cut_prompt" and inner is None:
        mask = shards.trainable
        for j in long.tolist():
            excess = int(counts[j]) + 1 - seq_len
            head = np.asarray(mask[starts[j] : starts[j] + excess]) if mask is not None else None
            if head is not None and not head.any() and excess < counts[j]:
                starts[j] += excess
                counts[j] -= excess
                fits[j] = True
                cut += 1
    keep = np.flatnonzero(fits)
    report = Truncation(len(counts), int(long.size), int(long.size) - cut, cut)
    stream = DocumentStream(
        shards.tokens,
        starts[keep],
        counts[keep],
        eos_id,
        vocab_size=vocab_size,
        where=str(shards.tokens_path),
        document_index=documents[keep],
        trainable=shards.trainable,
        inner=None if inner is None else inner[keep],
    )
    return stream, report
