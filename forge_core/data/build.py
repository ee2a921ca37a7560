"""The rows a run trains on, from the judged plan: sources -> tokens -> split -> layout.

For every source of the plan (``plan.sources``: each entry of ``data.sources``, or
``data.source`` as the one source):

1. **tokens**: a source that already is a shard directory (``shards``: it exposes
   ``shards``) or tokens of another format (it has ``token_documents(eos_id)``, giving
   :class:`~forge_core.api.TokenDocuments`: ``megatron``, ``token_file``) is
   memory-mapped as it is; any other is read through the token cache
   (:mod:`forge_core.data.cache`): tokenized once, by one process, then opened in
   milliseconds by every later run.
2. **split**: documents whose content hash falls in ``data.heldout`` are set aside
   (:mod:`forge_core.data.heldout`); :func:`heldout_documents` gives them to an
   evaluation.
3. **layout**: the packer places the training documents from their lengths alone
   (:mod:`forge_core.api.packing`); rows are read from the memory map when a
   batch is (:class:`~forge_core.data.packed_rows.PackedRows`).

Several sources become one :class:`~forge_core.data.mixture.MixedRows`. The one-line
summary says what was read, what the cache did, what the packer achieved, what was held
out and, for a mixture, the share of the run's rows each source gives.

A streamed source (``data.stream.enabled``, or its own streaming option) skips all of
this: :func:`build_stream` hands the source and its packer to the streaming loader
(:mod:`forge_core.data.stream`), which reads, tokenizes and packs it while training runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from forge_core.api import DOC_IDS, POSITIONS, ForgeError, Plan, TokenDocumentSource
from forge_core.config.schema import source_labels

if TYPE_CHECKING:
    from forge_core.registry import Registries

DOC_IDS_AND_POSITIONS = frozenset({DOC_IDS, POSITIONS})


def _stderr(message: str) -> None:
    print(f"forge: {message}", file=sys.stderr, flush=True)


def _quiet(message: str) -> None:
    pass


@attrs.frozen
class SourceData:
    """One source of the run: its tokens, its split and its rows."""

    label: str
    where: str  # its config path: data.source or data.sources[i]
    weight: float
    shards: Any  # forge_core.api.unstable.Shards
    train: np.ndarray | None  # document numbers in the shards that are trained on (None: all)
    heldout: np.ndarray  # and those held out
    rows: Any  # PackedRows or ArrayRows
    tokens_note: str
    chat_note: str = ""  # what data.chat.truncation did, for chat data


@attrs.frozen
class StreamedSource:
    """A source read as a stream (:mod:`forge_core.data.stream`): what its loader needs."""

    source: Any
    #: ``pack_window(DocumentStream) -> PackedRows``: the configured packer over one window.
    pack_window: Callable[[Any], Any]


@attrs.frozen
class TrainingData:
    rows: Any  # what the loader reads: one source's rows, or MixedRows; None for a stream
    sources: list[SourceData]
    seq_len: int
    summary: str
    stream: StreamedSource | None = None


def build_source(plan: Plan, registries: Registries, index: int) -> Any:
    """The plan's ``index``-th source, constructed; a mixture's errors say which entry."""
    from forge_core import components

    chosen = plan.sources[index]
    try:
        return components.source(plan, registries, index)
    except ForgeError as exc:
        if chosen.where == "data.source":
            raise
        raise ForgeError(f"{chosen.where} ({chosen.name}): {exc}") from None


def source_shards(
    source: Any,
    tokenizer: Any,
    cache: Any,
    label: str,
    *,
    is_main: bool = True,
    report: Callable[[str], None] = _stderr,
) -> tuple[Any, str]:
    """The memory-mapped tokens of ``source``: its own (a shard directory, or documents of
    another token format), or the cache's."""
    from forge_core.api.shards import Shards, TokenDocuments
    from forge_core.data.cache import cached_shards, default_root
    from forge_core.data.pipeline import check_tokenizer

    own = getattr(source, "shards", None)
    if isinstance(own, Shards):
        check_tokenizer(source, tokenizer)
        return own, f"memory-mapped from {own.path}"
    if isinstance(source, TokenDocumentSource):
        check_tokenizer(source, tokenizer)
        documents = source.token_documents(int(tokenizer.eos_id))
        if not isinstance(documents, TokenDocuments):
            raise TypeError(
                f"{type(source).__name__}.token_documents() must return a forge_core.api.TokenDocuments, "
                f"got {type(documents).__name__}"
            )
        check_token_dtype(documents, tokenizer)
        return documents, f"memory-mapped from {documents.path}"
    return cached_shards(
        source,
        tokenizer,
        root=cache.dir or default_root(),
        wait_s=cache.wait_s,
        label=label,
        progress=True,
        report=report if is_main else _quiet,
        announce=report,
    )


def check_token_dtype(documents: Any, tokenizer: Any) -> None:
    """Refuse tokens whose integer type cannot hold the tokenizer's ids: they were made by
    another tokenizer (one with a smaller vocabulary)."""
    dtype, vocab = documents.dtype, int(tokenizer.vocab_size)
    if dtype.kind not in "iu":
        raise ForgeError(f"{documents.path}: tokens of type {dtype.name}: token ids are integers.")
    if vocab - 1 > np.iinfo(dtype).max:
        raise ForgeError(
            f"{documents.path}: tokens of type {dtype.name} hold ids up to {np.iinfo(dtype).max}, but the "
            f"configured tokenizer ({tokenizer.identity}) has {vocab} ids: these tokens were made by another "
            "tokenizer. Configure the tokenizer they were made with (data.tokenizer)."
        )


def split_documents(shards: Any, heldout: Any) -> tuple[np.ndarray | None, np.ndarray]:
    """``(training documents, held-out documents)`` by number, each in corpus order;
    ``None`` for the training documents when every document is one (no index to keep)."""
    from forge_core.data.heldout import heldout_mask

    if heldout.fraction <= 0:  # no hash needed (a token format computes them on first read)
        return None, np.zeros(0, np.int64)
    held = heldout_mask(shards.hashes, heldout.fraction, heldout.seed)
    return np.flatnonzero(~held), np.flatnonzero(held)


def pack(
    packer: Any,
    spec: Any,
    options: Any,
    stream: Any,
    seq_len: int,
    eos_id: int,
    pad_id: int,
) -> Any:
    """Rows of ``stream`` under ``packer``, read lazily through its layout. The layout
    must keep the spec's promise about metadata."""
    from forge_core.data.packed_rows import PackedRows, check_layout, require_layout

    who = f"packer {spec.name!r} ({type(packer).__module__}.{type(packer).__qualname__})"
    require_layout(packer, who)
    layout = check_layout(packer.layout(stream.lengths), stream, seq_len, who)
    emitted = DOC_IDS_AND_POSITIONS if layout.metadata else frozenset()
    _check_emitted(
        who, spec.emitted(options), emitted, f"its layout has metadata={layout.metadata}, which gives"
    )
    return PackedRows(layout, stream, eos_id=eos_id, pad_id=pad_id)


def _check_emitted(who: str, declared: frozenset[str], emitted: frozenset[str], what: str) -> None:
    if declared != emitted:
        raise ForgeError(
            f"{who}: its spec declares that it emits {', '.join(sorted(declared)) or 'nothing'} under these "
            f"options, but {what} {', '.join(sorted(emitted)) or 'no metadata'}. The rule engine trusts the "
            "declaration: make the two agree (a layout emits doc_ids and positions together)."
        )


def _too_small(label: str, stream: Any, seq_len: int, packer: str) -> ForgeError:
    return ForgeError(
        f"{label}: {stream.total} tokens in {len(stream)} documents, not enough for one row of seq_len "
        f"{seq_len} ({packer}). Add data or lower data.seq_len."
    )


def build_training_data(
    plan: Plan,
    registries: Registries,
    tokenizer: Any,
    *,
    is_main: bool = True,
    report: Callable[[str], None] = _stderr,
) -> TrainingData:
    """Everything the loader reads, for the judged ``plan``; see the module docstring."""
    from forge_core import components
    from forge_core.core_rules import streamed_sources
    from forge_core.data.chat import chat_source, chat_stream
    from forge_core.data.mix_schedule import MixtureSchedule, Phase
    from forge_core.data.mixture import MixedRows
    from forge_core.data.shards import stream as document_stream

    if streamed_sources(plan):
        return build_stream(plan, registries, tokenizer)

    t0 = time.perf_counter()
    config = plan.config
    data = config.data
    labels = source_labels(plan.sources)
    eos, pad, vocab = int(tokenizer.eos_id), int(tokenizer.pad_id), int(tokenizer.vocab_size)
    packer_spec = plan.specs["packer"]
    parts = []
    for index, (chosen, label) in enumerate(zip(plan.sources, labels)):
        source = chat_source(build_source(plan, registries, index), tokenizer, data.chat)
        shards, note = source_shards(source, tokenizer, data.cache, label, is_main=is_main, report=report)
        train, held = split_documents(shards, data.heldout)
        if train is not None and not len(train):
            raise ForgeError(
                f"{label}: all {shards.num_documents} documents are held out "
                f"(data.heldout.fraction: {data.heldout.fraction}); lower the fraction."
            )
        chat_note = ""
        if data.chat.format:
            every = np.arange(shards.num_documents) if train is None else train
            stream, truncation = chat_stream(shards, every, eos, vocab, data.chat, data.seq_len)
            chat_note = truncation.note(data.seq_len, data.chat.format)
            if not len(stream):
                raise ForgeError(
                    f"{label}: {chat_note}, so nothing is left to train on (data.chat.truncation: "
                    f"{data.chat.truncation}). Raise data.seq_len or shorten the conversations."
                )
        else:
            stream = document_stream(shards, eos, vocab, train)
        packer = components.packer(plan, registries, tokenizer)
        rows = pack(
            packer,
            packer_spec,
            data.packer_options,
            stream,
            data.seq_len,
            eos,
            pad,
        )
        if rows.num_rows == 0:
            raise _too_small(source.describe(), stream, data.seq_len, type(packer).__name__)
        parts.append(
            SourceData(label, chosen.where, chosen.weight, shards, train, held, rows, note, chat_note)
        )
    if len(parts) == 1:
        rows = parts[0].rows
    else:
        phases = [
            Phase(
                entry.start_step,
                tuple(float(entry.weights[label]) for label in labels),
                entry.anneal_steps,
                f"data.phases[{i}]",
                tuple(f"data.phases[{i}].weights.{label}" for label in labels),
            )
            for i, entry in enumerate(data.phases)
        ]
        weights = [p.weight for p in parts]
        schedule = MixtureSchedule.of(weights, labels, phases, config.train.batch_size)
        rows = MixedRows([p.rows for p in parts], labels, schedule)
    summary = _summary(config, parts, rows, time.perf_counter() - t0)
    return TrainingData(rows, parts, data.seq_len, summary)


def build_stream(plan: Plan, registries: Registries, tokenizer: Any) -> TrainingData:
    """The one streamed source of ``plan`` and its packer, nothing read yet: the loader
    reads, tokenizes and packs it as training goes (:mod:`forge_core.data.stream`)."""
    from forge_core import components

    data = plan.config.data
    source = build_source(plan, registries, 0)
    if not callable(getattr(source, "documents", None)):
        raise ForgeError(f"{source.describe()} has no documents() to stream; set data.stream.enabled: false.")
    packer = components.packer(plan, registries, tokenizer)
    spec, options = plan.specs["packer"], data.packer_options
    eos, pad = int(tokenizer.eos_id), int(tokenizer.pad_id)

    def pack_window(stream: Any) -> Any:
        return pack(packer, spec, options, stream, data.seq_len, eos, pad)

    summary = (
        f"data: streaming rows of {data.seq_len} tokens ({source.describe()} -> {data.tokenizer} -> "
        f"{data.packer}), packed in windows of {data.stream.window_tokens:,} tokens, "
        f"{data.stream.ahead} tokenized ahead; documents, tokens and rows unknown until the stream ends"
    )
    return TrainingData(None, [], data.seq_len, summary, StreamedSource(source, pack_window))


def _stats(stats: dict[str, Any]) -> str:
    parts = [
        f"{key} {value:.1%}" if key in ("fill", "kept") else f"{key} {value:,}"
        for key, value in stats.items()
        if isinstance(value, (int, float))
    ]
    return ", ".join(parts)


def _held(part: SourceData) -> str:
    chat = f"; {part.chat_note}" if part.chat_note else ""
    n = len(part.heldout)
    if not n:
        return chat
    tokens = int(np.sum(part.shards.counts[part.heldout]))
    return f"{chat}; held out {n:,} of {part.shards.num_documents:,} documents ({tokens:,} tokens)"


def _summary(config: Any, parts: list[SourceData], rows: Any, seconds: float) -> str:
    data = config.data
    head = (
        f"data: {rows.num_rows:,} rows of {data.seq_len} tokens ("
        f"{'+'.join(p.label for p in parts)} -> {data.tokenizer} -> {data.packer}) in {seconds:.1f}s"
    )
    if len(parts) == 1:
        p = parts[0]
        return f"{head}; tokens {p.tokens_note}; packer: {_stats(p.rows.stats)}{_held(p)}"
    slots = config.train.steps * config.train.batch_size
    realized = rows.realized(slots)
    total_weight = sum(p.weight for p in parts)
    mixture = ", ".join(
        f"{p.label} {share:.1%} (weight {p.weight / total_weight:.1%})" for p, share in zip(parts, realized)
    )
    lines = [f"{head}; mixture over the run's {slots:,} rows: {mixture}"]
    lines += _phase_lines(rows, config.train.steps)
    lines += [
        f"  {p.label} ({p.where}): {p.rows.num_rows:,} rows; tokens {p.tokens_note}; packer: "
        f"{_stats(p.rows.stats)}{_held(p)}"
        for p in parts
    ]
    return "\n".join(lines)


def _phase_lines(rows: Any, steps: int) -> list[str]:
    """One line per phase of a ``data.phases`` schedule that the run reaches: its steps,
    its weights and the share of its rows each source gives."""
    from forge_core.data.mixture import shares as weight_shares

    schedule = rows.schedule
    phases = schedule.phases
    if len(phases) == 1:
        return []
    lines = []
    for i, phase in enumerate(phases):
        end = min(phases[i + 1].start if i + 1 < len(phases) else steps, steps)
        if end <= phase.start:
            continue
        b = schedule.step_slots
        realized = rows.realized(end * b, phase.start * b)
        weights = weight_shares(phase.weights)
        anneal = f", weights annealed over its first {phase.anneal:,} steps" if phase.anneal else ""
        shares = ", ".join(
            f"{label} {share:.1%} (weight {w:.1%})" for label, share, w in zip(rows.labels, realized, weights)
        )
        lines.append(f"  {phase.name}: steps {phase.start + 1:,}-{end:,}{anneal}: {shares}")
    return lines


def heldout_documents(
    plan: Plan, registries: Registries, tokenizer: Any, *, is_main: bool = True
) -> list[tuple[str, Any]]:
    """``(label, DocumentStream)`` of every source's held-out documents (EOS appended,
    read lazily from the same memory-mapped tokens), for an evaluation to pack or score.
    Opens the cache exactly as training does (tokenizing only if no run has yet); only
    the main process (``is_main``) reports progress. A stream has no held-out split (the
    rules refuse one): none, without reading it."""
    from forge_core.core_rules import streamed_sources
    from forge_core.data.chat import chat_source, chat_stream
    from forge_core.data.shards import stream as document_stream

    if streamed_sources(plan):
        return []
    data = plan.config.data
    eos, vocab = int(tokenizer.eos_id), int(tokenizer.vocab_size)
    out = []
    for index, label in enumerate(source_labels(plan.sources)):
        source = chat_source(build_source(plan, registries, index), tokenizer, data.chat)
        shards, _ = source_shards(source, tokenizer, data.cache, label, is_main=is_main)
        _, held = split_documents(shards, data.heldout)
        if data.chat.format:
            stream = chat_stream(shards, held, eos, vocab, data.chat, data.seq_len)[0]
        else:
            stream = document_stream(shards, eos, vocab, held)
        out.append((label, stream))
    return out
