"""Conformance checks for packers: token accounting, per-token metadata, declared
capabilities.

The kit packs its own documents: every token value except EOS occurs exactly once in
the whole corpus, so each input token names the document and offset it came from and
every invariant can be checked position by position, whatever the packer's strategy
(truncating, concatenating, bin packing, splitting long documents). The corpus holds a
one-token document (just EOS), documents of exactly ``seq_len``, one token under and
over it, and documents over twice as long. ``eos_id`` and ``pad_id`` differ, so padding
is recognisable.

What every packer must satisfy:

- ``layout(lengths)`` (the lazy contract, :class:`~forge_core.api.LazyPacker`)
  returns a :class:`~forge_core.api.RowLayout` that the kernel accepts
  (pieces inside the stream, no token placed twice, rows no longer than ``seq_len``,
  ``"documents"`` pieces inside one document), leaves the lengths unmodified, and gives
  the same layout when called twice. Its rows are then materialized exactly as a run
  reads them, and must carry ``input_ids``, ``labels`` and exactly the metadata keys its
  spec declares (``emits``, switched off by ``emits_when``);
- inputs are document tokens or ``pad_id``; no token appears twice; tokens of one
  document that sit side by side in a row are in document order; padding has label -100;
- a label is the next token of the input's document; where that token follows in the
  row, the label is not -100 (no loss silently dropped); the label of a document's EOS
  points into another document, so it is -100 for a packer that isolates documents and
  otherwise the next input token;
- with ``doc_ids``: non-decreasing along a row; two neighbouring tokens share an id only
  when they are consecutive tokens of one document; padding never shares an id with a
  real token after it; with ``positions``: they restart at 0 where ``doc_ids`` change and
  count up by one elsewhere (without ``doc_ids``: 0 at every document's first token);
- at least ``min_kept`` of the corpus tokens appear as inputs and of the next-token
  targets are trained on (all of them, exactly once, with ``lossless=True``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs
import numpy as np

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS, ForgeError
from forge_core.data.packed_rows import DocumentStream, PackedRows, check_layout, require_layout
from forge_core.testing.resolve import Resolved, resolve

EOS_ID = 1
PAD_ID = 0
FIRST_TOKEN = 2
SEQ_LEN = 16
REQUIRED = (INPUT_IDS, LABELS)

_PAD, _UNKNOWN_EOS = -1, -2


def conformance_documents(seq_len: int = SEQ_LEN, seed: int = 0) -> list[np.ndarray]:
    """The kit's corpus: documents (EOS appended) whose tokens are unique except EOS."""
    if seq_len < 4:
        raise ValueError(f"the packer checks need seq_len >= 4, got {seq_len}")
    S = seq_len
    lengths = [5, 1, S, 3, 2 * S + 8, S - 1, 2, S + 1, 7, 9, 1, 12, 6, 4, 2 * S + 1, 8]
    order = np.random.default_rng(seed).permutation(len(lengths))
    docs, next_token = [], FIRST_TOKEN
    for length in (lengths[i] for i in order):
        # int32 like the data pipeline's documents: a packer must still return int64.
        body = np.arange(next_token, next_token + length - 1, dtype=np.int32)
        next_token += length - 1
        docs.append(np.concatenate([body, np.array([EOS_ID], np.int32)]))
    return docs


@attrs.frozen
class PackerReport:
    """What a passing packer did with the corpus (under the options checked first)."""

    rows: int
    emitted: frozenset[str]
    kept: float  # share of corpus tokens that appear as inputs
    labelled: float  # share of next-token targets that are trained on
    outputs: dict[str, np.ndarray] = attrs.field(repr=False)


def check_packer(
    packer: Any,
    options: Any = None,
    *,
    emits: Iterable[str] | None = None,
    seq_len: int = SEQ_LEN,
    seed: int = 0,
    lossless: bool = False,
    min_kept: float = 0.5,
    extra_plugins: Iterable[tuple[str, Any]] = (),
) -> PackerReport:
    """Check a packer against the contract; raise AssertionError naming the first
    violation (row, column, tokens involved).

    ``packer`` is a registered name, a :class:`~forge_core.api.PackerSpec` or the
    implementation class (then ``emits`` says what it declares; default nothing).
    ``options``: a mapping or options instance (default: the spec's defaults). When
    the spec has ``emits_when``, the packer is also checked with that option flipped,
    and its emission must follow. ``lossless=True`` demands that every corpus token is
    an input exactly once and every next-token target is trained on exactly once.
    """
    resolved = resolve("packer", packer, options, extra_plugins)
    spec = resolved.spec
    if spec is None:
        declared_emits = frozenset(emits or ())
        declared: Callable[[Any], frozenset[str]] = lambda _opts: declared_emits  # noqa: E731
    else:
        declared = spec.emitted if emits is None else (lambda _opts: frozenset(emits))
    documents = conformance_documents(seq_len, seed)
    runs = [resolved.options]
    if spec is not None and spec.emits_when is not None:
        if not hasattr(resolved.options, spec.emits_when):
            raise AssertionError(
                f"{resolved.label}: emits_when names option {spec.emits_when!r}, which its options "
                f"class {type(resolved.options).__name__} does not have"
            )
        flipped = not getattr(resolved.options, spec.emits_when)
        runs.append(attrs.evolve(resolved.options, **{spec.emits_when: flipped}))
    reports = []
    for opts in runs:
        where = (
            resolved.label
            if opts is resolved.options
            else f"{resolved.label} with {spec.emits_when}={getattr(opts, spec.emits_when)}"
        )
        out = _pack(resolved, opts, documents, seq_len, where)
        _check_declared(out, declared(opts), where, spec, opts)
        kept, labelled = _check_tokens(out, documents, seq_len, where, lossless, min_kept)
        again = _pack(resolved, opts, documents, seq_len, where)
        if set(again) != set(out) or any(not np.array_equal(again[k], out[k]) for k in out):
            raise AssertionError(
                f"{where}: packing the same documents twice gave different results "
                "(the packer must be deterministic)"
            )
        emitted = frozenset(out) - set(REQUIRED)
        reports.append(PackerReport(out[INPUT_IDS].shape[0], emitted, kept, labelled, out))
    return reports[0]


def _pack(
    resolved: Resolved, options: Any, documents: list[np.ndarray], seq_len: int, where: str
) -> dict[str, np.ndarray]:
    packer = resolved.impl(options, seq_len=seq_len, eos_id=EOS_ID, pad_id=PAD_ID)
    try:
        require_layout(packer, where)
    except ForgeError as exc:
        raise AssertionError(str(exc)) from None
    out = _lazy_rows(packer, documents, seq_len, where)
    _check_arrays(out, seq_len, where)
    return out


def _check_arrays(out: dict[str, np.ndarray], seq_len: int, where: str) -> None:
    """Every key present as an int64 ``(rows, seq_len)`` array, the rows of one count."""
    for key in REQUIRED:
        if key not in out:
            raise AssertionError(f"{where}: the rows carry no {key!r} (keys: {sorted(out)})")
    rows = out[INPUT_IDS].shape[0] if out[INPUT_IDS].ndim == 2 else None
    for key, value in out.items():
        if value.dtype != np.int64:
            raise AssertionError(f"{where}: {key!r} has dtype {value.dtype}; every array must be int64")
        if value.ndim != 2 or value.shape[1] != seq_len or value.shape[0] != rows:
            raise AssertionError(
                f"{where}: {key!r} has shape {value.shape}; expected (rows, seq_len) = "
                f"({rows}, {seq_len}) like input_ids"
            )


def _lazy_rows(packer: Any, documents: list[np.ndarray], seq_len: int, where: str) -> dict[str, np.ndarray]:
    """The rows a run would read from ``packer``'s layout of ``documents``."""
    stream = DocumentStream.from_documents(documents)
    lengths = stream.lengths.copy()
    try:
        layout = check_layout(packer.layout(lengths), stream, seq_len, where)
    except ForgeError as exc:
        raise AssertionError(str(exc)) from None
    if not np.array_equal(lengths, stream.lengths):
        raise AssertionError(f"{where}: layout() modified the lengths it was given")
    if layout.rows == 0:
        raise AssertionError(f"{where}: layout() placed no row for {len(documents)} documents")
    return PackedRows(layout, stream, eos_id=EOS_ID, pad_id=PAD_ID).read(np.arange(layout.rows))


def _check_declared(
    out: dict[str, np.ndarray], declared: frozenset[str], where: str, spec: Any, options: Any
) -> None:
    emitted = frozenset(out) - set(REQUIRED)
    missing, undeclared = sorted(declared - emitted), sorted(emitted - declared)
    shown = "{" + ", ".join(sorted(declared)) + "}" if declared else "nothing"
    if missing:
        raise AssertionError(
            f"{where}: declares that it emits {shown} under these options, but its rows have no "
            f"{', '.join(missing)}. The rule engine trusts the declaration (it lets this packer "
            "run only where that metadata reaches attention), so emit it or remove it from "
            "the spec's emits (or name the switching option in emits_when)."
        )
    if undeclared:
        raise AssertionError(
            f"{where}: its rows carry {', '.join(undeclared)}, which the spec does not declare "
            f"(it declares {shown} under these options). Undeclared metadata is invisible to the "
            "rule engine, which then cannot refuse strategies that drop it: add it to the spec's emits."
        )


@attrs.frozen
class _Corpus:
    """The documents a packer was given, indexed so that every input token names its
    document and offset (the kit's documents hold distinct tokens but for EOS)."""

    documents: list[np.ndarray]
    lengths: list[int]
    owner: dict[int, tuple[int, int]]
    firsts: set[int]

    @classmethod
    def of(cls, documents: list[np.ndarray]) -> _Corpus:
        owner = {int(tok): (d, j) for d, doc in enumerate(documents) for j, tok in enumerate(doc[:-1])}
        return cls(documents, [len(d) for d in documents], owner, {int(doc[0]) for doc in documents})

    def token(self, d: int, j: int) -> int:
        return int(self.documents[d][j])


def _check_tokens(
    out: dict[str, np.ndarray],
    documents: list[np.ndarray],
    seq_len: int,
    where: str,
    lossless: bool,
    min_kept: float,
) -> tuple[float, float]:
    ids, labels = out[INPUT_IDS], out[LABELS]
    doc_ids, positions = out.get(DOC_IDS), out.get(POSITIONS)
    corpus = _Corpus.of(documents)
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    targets: dict[tuple[int, int], tuple[int, int]] = {}
    unknown_eos = 0
    identities: list[tuple[list[int], list[int]]] = []  # per row: source document and offset per column
    rows, S = ids.shape
    for r in range(rows):
        doc, off = _identify_row(corpus, ids, labels, doc_ids, r, seen, where)
        unknown_eos += doc.count(_UNKNOWN_EOS)
        for i in range(S):
            _check_label(
                r,
                i,
                ids,
                labels,
                doc,
                off,
                corpus.lengths,
                corpus.token,
                corpus.firsts,
                doc_ids is not None,
                targets,
                f"{where}: row {r}, column {i}",
            )
        identities.append((doc, off))
    # Metadata after every row's tokens and labels, doc_ids before positions: the first
    # message then names the most basic problem.
    if doc_ids is not None:
        for r, (doc, off) in enumerate(identities):
            _check_doc_ids(r, doc_ids[r], doc, off, where)
    if positions is not None:
        for r, (doc, off) in enumerate(identities):
            _check_positions(r, positions[r], None if doc_ids is None else doc_ids[r], doc, off, where)
    return _coverage(corpus, seen, unknown_eos, len(targets), where, lossless, min_kept)


def _identify_row(
    corpus: _Corpus,
    ids: np.ndarray,
    labels: np.ndarray,
    doc_ids: np.ndarray | None,
    r: int,
    seen: dict[tuple[int, int], tuple[int, int]],
    where: str,
) -> tuple[list[int], list[int]]:
    """Row ``r``'s source document and offset per column (:data:`_PAD` for padding,
    :data:`_UNKNOWN_EOS` for an EOS that ends no document here), each token an input at
    most once (``seen``) and every document's tokens in order."""
    S = ids.shape[1]
    doc = [_PAD] * S
    off = [-1] * S
    for i in range(S):
        x = int(ids[r, i])
        at = f"{where}: row {r}, column {i}"
        if x == PAD_ID:
            if labels[r, i] != IGNORE_INDEX:
                raise AssertionError(f"{at}: padding has label {labels[r, i]}; padding must have label -100")
            continue
        doc[i], off[i] = _identity(corpus, x, doc_ids, r, i, doc, off, at)
        if doc[i] >= 0:
            key = (doc[i], off[i])
            if key in seen:
                raise AssertionError(
                    f"{at}: token {off[i]} of document {doc[i]} appears twice "
                    f"(also at row {seen[key][0]}, column {seen[key][1]}); every token must be an input "
                    "at most once"
                )
            seen[key] = (r, i)
        if i and doc[i] >= 0 and doc[i] == doc[i - 1] and off[i] != off[i - 1] + 1:
            raise AssertionError(
                f"{at}: token {off[i]} of document {doc[i]} follows its token {off[i - 1]}; "
                "tokens of a document must stay in order"
            )
    return doc, off


def _identity(
    corpus: _Corpus,
    x: int,
    doc_ids: np.ndarray | None,
    r: int,
    i: int,
    doc: list[int],
    off: list[int],
    at: str,
) -> tuple[int, int]:
    """The document and offset of input token ``x`` at row ``r``, column ``i``: an EOS
    belongs to the document whose last token precedes it (in the same ``doc_ids``)."""
    if x == EOS_ID:
        lengths = corpus.lengths
        prev_d, prev_j = (doc[i - 1], off[i - 1]) if i else (_PAD, -1)
        same_id = doc_ids is None or i == 0 or doc_ids[r, i] == doc_ids[r, i - 1]
        if prev_d >= 0 and prev_j == lengths[prev_d] - 2 and same_id:
            return prev_d, lengths[prev_d] - 1
        return _UNKNOWN_EOS, -1
    if x in corpus.owner:
        return corpus.owner[x]
    raise AssertionError(f"{at}: input token {x} is neither a document token nor pad_id ({PAD_ID})")


def _coverage(
    corpus: _Corpus,
    seen: dict[tuple[int, int], tuple[int, int]],
    unknown_eos: int,
    trained: int,
    where: str,
    lossless: bool,
    min_kept: float,
) -> tuple[float, float]:
    """``(kept, labelled)``: the shares of the tokens that are inputs and of the
    next-token targets trained on, checked against ``lossless`` and ``min_kept``."""
    lengths, inputs = corpus.lengths, len(seen)
    total_tokens = sum(lengths)
    total_targets = sum(n - 1 for n in lengths)
    eos_inputs = unknown_eos + sum(1 for (d, j) in seen if j == lengths[d] - 1)
    if eos_inputs > len(lengths):
        raise AssertionError(
            f"{where}: {eos_inputs} EOS tokens among the inputs for {len(lengths)} documents"
        )
    kept = (inputs + unknown_eos) / total_tokens
    labelled = trained / total_targets
    if lossless and (inputs + unknown_eos != total_tokens or trained != total_targets):
        raise AssertionError(
            f"{where}: not lossless: {inputs + unknown_eos} of {total_tokens} tokens are inputs and "
            f"{trained} of {total_targets} next-token targets are trained on"
        )
    if kept < min_kept or labelled < min_kept:
        raise AssertionError(
            f"{where}: only {kept:.0%} of the tokens are inputs and {labelled:.0%} of the next-token "
            f"targets are trained on (at least {min_kept:.0%} of each expected)"
        )
    return kept, labelled


def _check_label(r, i, ids, labels, doc, off, lengths, token, firsts, isolating, targets, at) -> None:
    S = ids.shape[1]
    y = int(labels[r, i])
    d, j = doc[i], off[i]
    if d == _PAD:
        return
    at_eos = d == _UNKNOWN_EOS or j == lengths[d] - 1
    if at_eos:
        if y == IGNORE_INDEX:
            return
        if isolating:
            raise AssertionError(
                f"{at}: the label of an EOS is {y}, a token of the next document, while the packer "
                "isolates documents (emits doc_ids): a label must not cross a document boundary (use -100)"
            )
        expected_next = int(ids[r, i + 1]) if i + 1 < S else None
        if (expected_next is not None and y != expected_next) or (
            expected_next is None and y not in firsts and y != EOS_ID
        ):
            raise AssertionError(f"{at}: the label of an EOS is {y}, which is not the next input token")
        return
    want = token(d, j + 1)
    follows = i + 1 < S and doc[i + 1] == d and off[i + 1] == j + 1
    if y == IGNORE_INDEX:
        if follows:
            raise AssertionError(
                f"{at}: label is -100 although the next token of the same document ({want}) follows "
                "in the row: that loss is silently dropped"
            )
        return
    if y != want:
        raise AssertionError(
            f"{at}: label {y} is not the next token of the input's document (document {d}, token {j}: "
            f"expected {want} or -100)"
        )
    if (d, j + 1) in targets:
        prev = targets[(d, j + 1)]
        raise AssertionError(
            f"{at}: token {j + 1} of document {d} is a target twice (also at row {prev[0]}, column {prev[1]})"
        )
    targets[(d, j + 1)] = (r, i)


def _check_doc_ids(r: int, row: np.ndarray, doc: list[int], off: list[int], where: str) -> None:
    for i in range(1, len(row)):
        at = f"{where}: row {r}, column {i}"
        if row[i] < row[i - 1]:
            raise AssertionError(
                f"{at}: doc_ids decrease ({row[i - 1]} -> {row[i]}); they must never decrease along a row"
            )
        if row[i] != row[i - 1]:
            continue
        left, right = doc[i - 1], doc[i]
        if left == _PAD and right != _PAD:
            raise AssertionError(
                f"{at}: a real token shares doc_id {row[i]} with the padding before it, "
                "so it attends to padding"
            )
        if left != _PAD and right != _PAD and not (left >= 0 and left == right and off[i] == off[i - 1] + 1):
            raise AssertionError(
                f"{at}: doc_id {row[i]} spans two documents ({_name(left, off[i - 1])} then "
                f"{_name(right, off[i])}), so attention mixes them; give every document its own id"
            )


def _check_positions(
    r: int, row: np.ndarray, ids_row: np.ndarray | None, doc: list[int], off: list[int], where: str
) -> None:
    if (row < 0).any():
        raise AssertionError(f"{where}: row {r}: negative positions {row.tolist()}")
    for i in range(len(row)):
        at = f"{where}: row {r}, column {i}"
        if ids_row is not None:
            if i and ids_row[i] != ids_row[i - 1] and row[i] != 0:
                raise AssertionError(
                    f"{at}: a new document starts (doc_ids {ids_row[i - 1]} -> {ids_row[i]}) "
                    f"but its position is {row[i]}, not 0"
                )
            if i and ids_row[i] == ids_row[i - 1] and row[i] != row[i - 1] + 1:
                raise AssertionError(
                    f"{at}: position {row[i]} after {row[i - 1]} within one document; "
                    "positions must count up by one"
                )
        elif doc[i] >= 0 and off[i] == 0 and row[i] != 0:
            raise AssertionError(f"{at}: the first token of document {doc[i]} has position {row[i]}, not 0")


def _name(d: int, j: int) -> str:
    return "an EOS of unknown document" if d == _UNKNOWN_EOS else f"document {d} token {j}"
