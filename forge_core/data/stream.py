"""Streaming: train while the source is read, tokenized and packed ahead, without the
token cache and without knowing the corpus's size.

A streamed source (``data.stream.enabled``, or a source whose spec names a streaming
option that is on: ``hf_datasets`` with ``streaming: true``) is read by
:class:`StreamingLoader`:

- **Partition.** Data-parallel rank ``r`` of ``n`` reads the documents ``i`` with
  ``i % n == r`` (:func:`rank_documents`): the ranks' documents are disjoint and
  together are the stream. Every process of a data-parallel slice (pipeline stages,
  tensor-parallel ranks) reads the same documents and builds the same rows.
- **Windows.** A background thread tokenizes this rank's documents and gathers them into
  *windows* of at least ``data.stream.window_tokens`` tokens (EOS included; the fewest
  documents that reach it, or what is left at the end of the stream). The configured
  packer lays out one window at a time (its ``layout(lengths)`` over the window's
  documents: ``bfd`` fits documents within a window). What the layout leaves unplaced
  at the window's end is carried into the next window: for a packer whose pieces run
  across documents (``concat``: boundaries ``eos``/``none``) the stream from the end of
  its last piece, part of a document included, so ``concat`` rows are exactly those of
  the whole stream; for one whose pieces stay inside documents (``bfd``, ``none``) the
  documents after the last one it touched (none for those two). The window's rows are
  materialized in the thread, in a seeded order (``[seed, pass, window]``) with
  ``data.shuffle``.
- **Bounded.** The thread's queue holds ``data.stream.ahead`` windows: it stops reading
  when the queue is full, so memory is a few windows whatever the corpus size, and the
  first batch comes as soon as one window is packed.
- **Passes.** At the end of the stream the thread packs what is left and opens the
  source again (``documents()`` is called anew) for the next pass; the pass number is in
  the state. A stream whose pass gives no row at all is an error.
- **Exact resume.** The state is the position of the window being read, counted in
  this process as batches are handed out (never by the thread, which runs ahead):
  ``(pass, window, document, offset, row)``: the window starts at this rank's
  ``document``-th document, after its first ``offset`` tokens (what the window before
  placed), and ``row`` of its rows were handed out. A restored loader reads the
  documents before ``document`` without tokenizing them, rebuilds that window and skips
  ``row`` rows: the batches are bit-identical to an uninterrupted run's.

Why a thread and not a process: the window's work is tokenizing (``tokenizers``'
``encode_batch`` releases the GIL), reading files (pyarrow, the OS) and numpy packing,
which leave the interpreter free most of the time; a thread shares the source object
(no pickling of a third-party source, no second copy of an open data set), hands
back its exceptions as they are, and needs no start-up. A pure-Python tokenizer slower
than the step would want a process; none of the built-ins is.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
import torch

from forge_core.api import ForgeError, MaskedDocument
from forge_core.data.packed_rows import DocumentStream


def rank_documents(documents: Iterator[Any], rank: int, size: int, start: int = 0) -> Iterator[Any]:
    """This rank's documents of ``documents`` (global ``i`` with ``i % size == rank``),
    from its ``start``-th on; the ones before are read and dropped, not tokenized."""
    first = start * size + rank
    for i, document in enumerate(documents):
        if i >= first and i % size == rank:
            yield document


@attrs.frozen
class Position:
    """Where a window starts: ``pass_number``, its number in the pass, and this rank's
    ``document`` (counted in the rank's own documents) after ``offset`` tokens."""

    pass_number: int = 0
    window: int = 0
    document: int = 0
    offset: int = 0


@attrs.frozen(eq=False)
class Window:
    position: Position
    rows: dict[str, np.ndarray]  # (num_rows, seq_len), in the order they are handed out
    num_rows: int
    documents: int  # this rank's documents read when the window was cut, in the pass
    tokens: int  # tokens placed in rows so far in the pass, this window's included


@attrs.frozen
class PassEnd:
    pass_number: int
    documents: int
    tokens: int
    rows: int


class _Stop(Exception):
    pass


class _Part:
    """A source's documents as one rank reads them, for the tokenizing pipeline."""

    def __init__(self, source: Any, rank: int, size: int, start: int) -> None:
        self.source, self.rank, self.size, self.start = source, rank, size, start
        self.tokenizer_identity = getattr(source, "tokenizer_identity", None)

    def describe(self) -> str:
        return self.source.describe()

    def documents(self) -> Iterator[Any]:
        return rank_documents(iter(self.source.documents()), self.rank, self.size, self.start)


class StreamingLoader:
    """Infinite iterator of ``dict[str, LongTensor (batch_size, seq_len)]`` over a
    streamed source; see the module docstring. ``pack_window(stream)`` returns the
    packed rows (``num_rows``, ``layout``, ``read``) of a
    :class:`~forge_core.data.packed_rows.DocumentStream`."""

    #: What the trainer asks a loader about a mixture: a stream is one source.
    mixture = None
    last_sources = None

    def __init__(
        self,
        source: Any,
        tokenizer: Any,
        pack_window: Callable[[DocumentStream], Any],
        batch_size: int,
        *,
        seq_len: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        window_tokens: int = 1_048_576,
        ahead: int = 2,
        report: Callable[[str], None] | None = None,
    ) -> None:
        if batch_size < 1 or dp_size < 1 or not 0 <= dp_rank < dp_size or ahead < 1:
            raise ValueError(
                f"bad loader arguments: batch_size={batch_size}, dp_rank={dp_rank}, "
                f"dp_size={dp_size}, ahead={ahead}"
            )
        if window_tokens < 2 * seq_len:
            raise ForgeError(
                f"data.stream.window_tokens: {window_tokens} is less than two rows of data.seq_len "
                f"{seq_len}: a window must hold at least {2 * seq_len} tokens. Raise it."
            )
        self.source = source
        self.tokenizer = tokenizer
        self.pack_window = pack_window
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.seed, self.shuffle = seed, shuffle
        self.window_tokens, self.ahead = window_tokens, ahead
        self.report = report or (lambda message: None)
        self.eos = int(tokenizer.eos_id)
        self.vocab = int(tokenizer.vocab_size)
        self.position = Position()
        self.row = 0  # rows of the current window handed out
        self.produced = 0  # this rank's documents the thread has read in the current pass
        self._window: Window | None = None
        self._skip = 0  # rows of the first window to skip after a restore
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[Any] | None = None
        self._stop = threading.Event()
        self._started = 0.0
        self._windows = 0  # windows read by this process, for the status lines

    # -- the background thread ------------------------------------------------------

    def _produce(self, start: Position, out: queue.Queue[Any], stop: threading.Event) -> None:
        def put(item: Any) -> None:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue
            raise _Stop

        try:
            position = start
            while not stop.is_set():
                self._produce_pass(position, put, stop)
                position = Position(position.pass_number + 1)
        except _Stop:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread as it is
            try:
                put(exc)
            except _Stop:
                return

    def _documents(self, start: int) -> Iterator[np.ndarray]:
        """This rank's tokenized documents from its ``start``-th, as int32 arrays."""
        from forge_core.data.pipeline import tokenize

        part = _Part(self.source, self.dp_rank, self.dp_size, start)
        for batch, _ in tokenize(part, self.tokenizer, progress=False):
            for document in batch:
                if isinstance(document, MaskedDocument):
                    raise ForgeError(
                        f"{self.source.describe()}: a document with a trainable mask (chat data) "
                        "cannot be streamed yet: set data.stream.enabled: false."
                    )
                self.produced += 1
                yield document

    def _produce_pass(self, start: Position, put: Callable[[Any], None], stop: threading.Event) -> None:
        documents = self._documents(start.document)
        buffer: list[np.ndarray] = []  # documents start.document onwards, the first cut at offset
        first, offset, window = start.document, start.offset, start.window
        tokens = rows = 0
        self.produced = start.document
        done = False
        while not stop.is_set():
            have = sum(len(d) + 1 for d in buffer) - offset
            while have < self.window_tokens and not done:
                document = next(documents, None)
                if document is None:
                    done = True
                else:
                    buffer.append(document)
                    have += len(document) + 1
            if not buffer:
                break
            # The window: the fewest documents of the buffer that reach window_tokens.
            lengths = np.array([len(d) + 1 for d in buffer], np.int64)
            lengths[0] -= offset
            reach = np.cumsum(lengths)
            n = (
                len(buffer)
                if reach[-1] < self.window_tokens
                else int(np.searchsorted(reach, self.window_tokens)) + 1
            )
            ids = [buffer[0][offset:]] + buffer[1:n]
            packed = self.pack_window(self._stream(ids))
            last = done and n == len(buffer)
            k, k_offset = self._carry(packed.layout, lengths[:n])
            if k == 0 and k_offset == 0 and not last:
                raise ForgeError(
                    f"{self.source.describe()}: the packer placed nothing from a window of "
                    f"{int(reach[n - 1]):,} tokens; raise data.stream.window_tokens ({self.window_tokens:,})."
                )
            position = Position(start.pass_number, window, first, offset)
            tokens += int(packed.layout.lengths.sum())
            rows += packed.num_rows
            if packed.num_rows:
                order = np.arange(packed.num_rows)
                if self.shuffle:
                    order = np.random.default_rng([self.seed, start.pass_number, window]).permutation(order)
                read = {key: value.astype(np.int32) for key, value in packed.read(order).items()}
                put(Window(position, read, packed.num_rows, first + n, tokens))
            if last:
                break
            # The next window starts at document k of this one, after k_offset of its tokens
            # (counted in the document as a whole: the first one was already cut).
            if k == 0:
                k_offset += offset
            buffer, first, offset, window = buffer[k:], first + k, k_offset, window + 1
        if not stop.is_set():
            if rows == 0:
                raise ForgeError(
                    f"{self.source.describe()}: one pass of the stream gives no row of data.seq_len "
                    f"{self.seq_len} on data-parallel rank {self.dp_rank} of {self.dp_size}. Add data "
                    "or lower data.seq_len."
                )
            put(PassEnd(start.pass_number, self.produced, tokens, rows))

    def _stream(self, ids: list[np.ndarray]) -> DocumentStream:
        count = np.fromiter((len(d) for d in ids), np.int64, len(ids))
        flat = np.concatenate(ids).astype(np.int32, copy=False) if ids else np.zeros(0, np.int32)
        where = f"{self.source.describe()} (streamed)"
        return DocumentStream(
            flat, np.cumsum(count) - count, count, self.eos, vocab_size=self.vocab, where=where
        )

    @staticmethod
    def _carry(layout: Any, lengths: np.ndarray) -> tuple[int, int]:
        """``(document, offset)`` in the window where what the layout left unplaced at its
        end begins (see the module docstring); ``(len(lengths), 0)`` when nothing is."""
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if not layout.num_pieces:
            return 0, 0
        end = int((layout.starts + layout.lengths).max())
        if layout.boundaries == "documents":
            return int(np.searchsorted(offsets, end, side="left")), 0  # after the last document touched
        if end >= offsets[-1]:
            return len(lengths), 0
        doc = int(np.searchsorted(offsets, end, side="right")) - 1
        return doc, end - int(offsets[doc])

    # -- the training process -------------------------------------------------------

    def _start(self) -> None:
        self.close()
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.ahead)
        self._skip = self.row
        self._started = time.perf_counter()
        self._thread = threading.Thread(
            target=self._produce,
            args=(self.position, self._queue, self._stop),
            name="forge-stream",
            daemon=True,
        )
        self._thread.start()

    def _next_window(self) -> Window:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, PassEnd):
                self.report(
                    f"stream: pass {item.pass_number} ended on data-parallel rank {self.dp_rank}: "
                    f"{item.documents:,} documents, {item.tokens:,} tokens in {item.rows:,} rows; pass "
                    f"{item.pass_number + 1} reads the source again"
                )
                continue
            return item

    def _advance(self) -> None:
        first = self._window is None
        window = self._next_window()
        if first and self._skip:
            if window.position != self.position:
                raise RuntimeError(
                    f"stream restored at {self.position}, the first window is at {window.position}"
                )
            self.row, self._skip = self._skip, 0
        else:
            self.row = 0
        self._window, self.position = window, window.position
        self._windows += 1
        if self._windows & (self._windows - 1) == 0 and self._windows > 1:  # 2, 4, 8, ...: a few lines
            self.report(self.status())
        if first:
            self.report(
                f"stream: first window after {time.perf_counter() - self._started:.1f}s: "
                f"{window.num_rows:,} rows from {window.documents:,} documents of this rank "
                f"({window.tokens:,} tokens so far); "
                f"{self.ahead} windows of {self.window_tokens:,} tokens tokenized ahead"
            )

    def __iter__(self) -> StreamingLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._thread is None:
            self._start()
        pieces = []
        need = self.batch_size
        while need:
            if self._window is None or self.row == self._window.num_rows:
                self._advance()
            w = self._window
            assert w is not None
            take = min(need, w.num_rows - self.row)
            pieces.append({k: v[self.row : self.row + take] for k, v in w.rows.items()})
            self.row += take
            need -= take
        return {
            k: torch.from_numpy(np.concatenate([p[k] for p in pieces]).astype(np.int64)) for k in pieces[0]
        }

    def status(self) -> str:
        """What is known now: the position and how far the thread has read ahead."""
        ahead = max(self.produced - (self._window.documents if self._window else 0), 0)
        tokens = self._window.tokens if self._window else 0
        return (
            f"stream: pass {self.position.pass_number}, window {self.position.window}: {ahead:,} documents "
            f"read ahead, {tokens:,} tokens so far in this pass; totals unknown until it ends"
        )

    def close(self) -> None:
        """Stop the background thread (a daemon: it also dies with the process)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
        self._thread, self._queue, self._window = None, None, None

    # -- resume --------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        return {
            "stream": self.source.describe(),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "seq_len": self.seq_len,
            "window_tokens": self.window_tokens,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
        }

    def state_dict(self) -> dict[str, Any]:
        p = self.position
        return {
            "pass": p.pass_number,
            "window": p.window,
            "document": p.document,
            "offset": p.offset,
            "row": self.row,
            **self._identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken: the source, seed, shuffling,
        ``seq_len``, window size and data-parallel layout must match."""
        if "stream" not in state:
            raise ForgeError(
                "cannot resume the data loader: the checkpoint was saved reading the token cache, "
                "the config now streams the source. Resume with data.stream.enabled as it was, "
                "or start a new run."
            )
        for key, now in self._identity().items():
            if state.get(key) != now:
                raise ForgeError(
                    f"cannot resume the data loader: {key} was {state.get(key)!r} when the checkpoint "
                    f"was saved and is {now!r} now. A stream resumes with the same source, seed, "
                    "data.seq_len, data.stream.window_tokens and data-parallel ranks; or start a new run."
                )
        self.close()
        self.position = Position(
            int(state["pass"]), int(state["window"]), int(state["document"]), int(state["offset"])
        )
        self.row = int(state["row"])
