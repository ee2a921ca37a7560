"""The built-in packers: pinned ``concat`` semantics, a randomized comparison with the
literal per-token loop, ``bfd`` invariants and the linear cost of its placement, ``none``,
and the registration contract. (bench/packing.py times the packers.)"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from forge_core.api import DOC_IDS, IGNORE_INDEX, POSITIONS
from forge_core.data.packed_rows import DocumentStream, PackedRows, check_layout
from forge_plugins.packers import plugin
from forge_plugins.packers.bfd import BfdPacker, place
from forge_plugins.packers.concat import ConcatPacker
from forge_plugins.packers.none import NonePacker
from forge_plugins.packers.options import ConcatOptions

EOS = 9
X = IGNORE_INDEX


def packed(packer, documents):
    """Every row of ``packer``'s layout of ``documents``, as a run reads them, and the stats."""
    stream = DocumentStream.from_documents(documents)
    layout = check_layout(packer.layout(stream.lengths.copy()), stream, packer.seq_len, "packer")
    rows = PackedRows(layout, stream, eos_id=packer.eos_id, pad_id=packer.pad_id)
    return rows.read(np.arange(rows.num_rows)), rows.stats


def concat(stream, seq_len=4, isolate=True):
    """``concat`` over a raw stream (one "document" holding EOS ids wherever the test puts them)."""
    packer = ConcatPacker(ConcatOptions(isolate=isolate), seq_len=seq_len, eos_id=EOS, pad_id=0)
    out, stats = packed(packer, [np.asarray(stream, dtype=np.int64)])
    return {k: v.tolist() for k, v in out.items()}, stats


# --- concat: pinned semantics ------------------------------------------------------


def test_concat_eos_at_position_zero():
    out, _ = concat([EOS, 1, 2, 3, 4])
    assert out["input_ids"] == [[EOS, 1, 2, 3]]
    assert out["labels"] == [[X, 2, 3, 4]]  # EOS's label would start the next document
    assert out["doc_ids"] == [[0, 1, 1, 1]]  # the EOS ends document 0
    assert out["positions"] == [[0, 0, 1, 2]]


def test_concat_consecutive_eos_are_each_a_document():
    out, _ = concat([1, EOS, EOS, 2, 3])
    assert out["labels"] == [[EOS, X, X, 3]]
    assert out["doc_ids"] == [[0, 0, 1, 2]]
    assert out["positions"] == [[0, 1, 0, 0]]


def test_concat_without_any_eos_is_one_document():
    out, _ = concat([1, 2, 3, 4, 5])
    assert out["labels"] == [[2, 3, 4, 5]]
    assert out["doc_ids"] == [[0, 0, 0, 0]]
    assert out["positions"] == [[0, 1, 2, 3]]


def test_concat_eos_as_last_input_and_as_last_label():
    out, _ = concat([1, 2, 3, EOS, 5])
    assert out["labels"] == [[2, 3, EOS, X]]
    assert out["doc_ids"] == [[0, 0, 0, 0]]  # an EOS counts only for the tokens after it
    assert out["positions"] == [[0, 1, 2, 3]]
    out, _ = concat([1, 2, 3, 4, EOS])
    assert out["labels"] == [[2, 3, 4, EOS]]  # the last token still predicts its EOS


def test_concat_window_starting_mid_document_and_dropped_tail():
    out, stats = concat([1, 2, EOS, 3, 4, 5, 6, EOS, 7, EOS])
    assert out["input_ids"] == [[1, 2, EOS, 3], [4, 5, 6, EOS]]
    # The label of a row's last position is the next row's first input (same document).
    assert out["labels"] == [[2, EOS, X, 4], [5, 6, EOS, X]]
    assert out["doc_ids"] == [[0, 0, 0, 1], [0, 0, 0, 0]]
    # Row 1 starts inside document "3 4 5 6 EOS": its positions start at 0.
    assert out["positions"] == [[0, 1, 2, 0], [0, 1, 2, 3]]
    # The tail [7, EOS] does not fill a window of seq_len + 1 tokens: dropped.
    assert stats["rows"] == 2 and stats["kept"] == pytest.approx(8 / 10)


def test_concat_without_isolation_emits_plain_shifted_labels_only():
    out, _ = concat([1, 2, EOS, 3, 4], isolate=False)
    assert set(out) == {"input_ids", "labels"}
    assert out["labels"] == [[2, EOS, 3, 4]]


def test_concat_needs_seq_len_plus_one_tokens_for_a_row():
    out, _ = concat([1, 2, 3, EOS])
    assert out["input_ids"] == [] and out["doc_ids"] == []
    out, _ = concat([1, 2, 3, 4, EOS])
    assert len(out["input_ids"]) == 1


def test_concat_pack_joins_documents_and_returns_int64():
    docs = [np.array([1, 2, EOS], np.int32), np.array([3, EOS], np.int32), np.array([4, 5, EOS], np.int32)]
    packer = ConcatPacker(ConcatOptions(), seq_len=3, eos_id=EOS, pad_id=0)
    out, _ = packed(packer, docs)
    ref, _ = concat(np.concatenate(docs), seq_len=3)
    assert {k: v.tolist() for k, v in out.items()} == ref
    assert all(v.dtype == np.int64 and v.shape == (2, 3) for v in out.values())


# --- concat: randomized comparison with the per-token loop --------------------------


def reference_concat(stream: list[int], seq_len: int, eos: int):
    """The literal definition, one token at a time (bench/packing.py times its own copy)."""
    rows = max(len(stream) - 1, 0) // seq_len
    doc_ids, labels, positions = [], [], []
    for r in range(rows):
        w = stream[r * seq_len : r * seq_len + seq_len + 1]
        count, pos = 0, 0
        d_row, l_row, p_row = [], [], []
        for i in range(seq_len):
            d_row.append(count)  # EOS tokens strictly before i
            p_row.append(pos)
            if w[i] == eos:
                l_row.append(-100)  # the label would be the next document's first token
                count += 1
                pos = 0
            else:
                l_row.append(w[i + 1])
                pos += 1
        doc_ids.append(d_row)
        labels.append(l_row)
        positions.append(p_row)
    return doc_ids, labels, positions


@pytest.mark.numerical
@pytest.mark.parametrize("density", [0.0, 0.01, 0.1, 0.3, 0.7, 1.0])
def test_concat_matches_per_token_loop_on_random_streams(density):
    rng = np.random.default_rng(int(density * 1000))
    for _ in range(150):
        seq_len = int(rng.integers(1, 33))
        n = int(rng.integers(0, 8 * seq_len + 3))
        stream = rng.integers(0, EOS, n)
        stream[rng.random(n) < density] = EOS
        out, _ = concat(stream, seq_len=seq_len)
        doc_ids, labels, positions = reference_concat(stream.tolist(), seq_len, EOS)
        assert out["doc_ids"] == doc_ids, (stream.tolist(), seq_len)
        assert out["labels"] == labels, (stream.tolist(), seq_len)
        assert out["positions"] == positions, (stream.tolist(), seq_len)
        flat_in = np.asarray(out["input_ids"], np.int64).reshape(-1)
        assert flat_in.tolist() == stream[: flat_in.size].tolist()


# --- bfd ---------------------------------------------------------------------------


def unique_docs(lengths):
    """Documents of consecutive unique ids (from 1000): every token is identifiable."""
    docs, start = [], 1000
    for n in lengths:
        docs.append(np.arange(start, start + n, dtype=np.int64))
        start += n
    return docs


@pytest.mark.numerical
@pytest.mark.parametrize("seed", range(5))
def test_bfd_places_every_token_once_and_splits_only_long_documents_in_order(seed):
    rng = np.random.default_rng(seed)
    S = int(rng.integers(4, 40))
    lengths = np.maximum(1, rng.lognormal(np.log(S / 3), 1.0, int(rng.integers(1, 200))).astype(int))
    docs = unique_docs(lengths)
    packer = BfdPacker(None, seq_len=S, eos_id=EOS, pad_id=0)
    out, stats = packed(packer, docs)
    ids, labels, doc_ids, positions = (out[k] for k in ("input_ids", "labels", "doc_ids", "positions"))
    assert ids.shape[1] == S and all(v.shape == ids.shape and v.dtype == np.int64 for v in out.values())

    real = ids != 0
    flat = np.concatenate(docs)
    assert np.array_equal(np.sort(ids[real]), flat)  # every token exactly once
    last_of_doc = {int(d[-1]) for d in docs}
    doc_of = {int(t): i for i, d in enumerate(docs) for t in d}

    chunk_rows: dict[int, list[tuple[int, int]]] = {}
    for r in range(ids.shape[0]):
        fill = int(real[r].sum())
        assert real[r, :fill].all() and not real[r, fill:].any()  # pieces left, padding right
        pieces = np.split(np.arange(fill), np.flatnonzero(np.diff(doc_ids[r, :fill])) + 1) if fill else []
        for slot, cols in enumerate(pieces):
            toks = ids[r, cols]
            assert (doc_ids[r, cols] == slot).all()
            assert positions[r, cols].tolist() == list(range(len(cols)))
            assert np.array_equal(toks, np.arange(toks[0], toks[0] + len(toks)))  # contiguous run
            d = doc_of[int(toks[0])]
            assert doc_of[int(toks[-1])] == d  # a piece never spans two documents
            if len(docs[d]) <= S:
                assert len(toks) == len(docs[d])  # short documents are never split
            else:
                offset = int(toks[0] - docs[d][0])
                assert offset % S == 0  # chunks start at multiples of seq_len
                if len(toks) == S:
                    chunk_rows.setdefault(d, []).append((offset, r))
        for c in range(fill):
            t = int(ids[r, c])
            assert labels[r, c] == (X if t in last_of_doc else t + 1)
        assert (labels[r, fill:] == X).all()
        assert (doc_ids[r, fill:] == len(pieces)).all()  # padding: its own document
        assert positions[r, fill:].tolist() == list(range(S - fill))
    for chunks in chunk_rows.values():  # the chunks of a long document come in order
        assert [r for _, r in sorted(chunks)] == sorted(r for _, r in chunks)

    assert stats["fill"] == pytest.approx(real.sum() / ids.size)
    assert stats["kept"] == 1.0
    assert stats["split_documents"] == int((lengths > S).sum())


@pytest.mark.numerical
def test_bfd_every_placement_is_a_best_fit():
    rng = np.random.default_rng(7)
    S = 50
    lengths = rng.integers(1, S + 1, 400)
    rows, cols, n_rows = place(lengths, S)
    room: dict[int, int] = {}
    for j in np.argsort(-lengths, kind="stable"):
        n = int(lengths[j])
        fits = {r: c for r, c in room.items() if c >= n}
        if fits:
            assert room[int(rows[j])] == min(fits.values())
        else:
            assert int(rows[j]) == len(room)  # a new row only when none fits
            room[int(rows[j])] = S
        assert cols[j] == S - room[int(rows[j])]
        room[int(rows[j])] -= n
    assert n_rows == len(room)


def test_bfd_fill_on_lognormal_documents():
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(np.log(300), 1.0, 20_000).astype(int))
    rows, _, n_rows = place(np.minimum(lengths, 2048), 2048)
    assert np.minimum(lengths, 2048).sum() / (n_rows * 2048) > 0.99


def _lines_run_in(function, *args) -> int:
    """Lines of Python executed in ``function``'s own frame while it runs: a deterministic
    count of its work, whatever the machine's speed."""
    count = 0

    def in_frame(frame, event, arg):
        nonlocal count
        count += event == "line"
        return in_frame

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: in_frame if frame.f_code is function.__code__ else None)
    try:
        function(*args)
    finally:
        sys.settrace(previous)
    return count


def test_bfd_placement_does_constant_work_per_document():
    # Ten times the documents (and rows): ten times the work. A scan over the open rows
    # for every document would do a hundred times as much. (bench/packing.py times it.)
    def work(n):
        lengths = np.maximum(1, np.random.default_rng(1).lognormal(np.log(300), 1.0, n).astype(np.int64))
        return _lines_run_in(place, np.minimum(lengths, 2048), 2048)

    small, large = work(2_000), work(20_000)
    assert 9 * small < large < 11 * small, (small, large)


def test_line_count_sees_a_scan_over_rows():
    # The measure has power: a placement that scans every open row is caught.
    def first_fit(lengths, capacity):
        room = []
        for length in lengths:
            for r, free in enumerate(room):
                if free >= length:
                    room[r] -= length
                    break
            else:
                room.append(capacity - length)

    lengths = np.random.default_rng(1).integers(1, 64, 1_000)
    assert _lines_run_in(first_fit, lengths[:100], 64) * 30 < _lines_run_in(first_fit, lengths, 64)


# --- none --------------------------------------------------------------------------


def test_none_pads_short_and_truncates_long_documents():
    docs = [np.array([1, 2, EOS]), np.array([3, 4, 5, 6, 7, EOS])]
    packer = NonePacker(None, seq_len=4, eos_id=EOS, pad_id=0)
    out, stats = packed(packer, docs)
    assert set(out) == {"input_ids", "labels"}
    assert out["input_ids"].tolist() == [[1, 2, EOS, 0], [3, 4, 5, 6]]
    # The last kept token of a truncated document keeps its label (the next token).
    assert out["labels"].tolist() == [[2, EOS, X, X], [4, 5, 6, 7]]
    assert stats["kept"] == pytest.approx(7 / 9)
    assert stats["fill"] == pytest.approx(7 / 8)


# --- registration ------------------------------------------------------------------


def test_specs_declare_what_each_packer_emits():
    specs = {s.name: s for s in plugin.forge_packers()}
    assert set(specs) == {"none", "concat", "bfd"}
    assert specs["none"].emitted(None) == frozenset()
    assert specs["concat"].emitted(ConcatOptions()) == {DOC_IDS, POSITIONS}
    assert specs["concat"].emitted(ConcatOptions(isolate=False)) == frozenset()
    assert specs["bfd"].emitted(None) == {DOC_IDS, POSITIONS}
    for spec in specs.values():
        packer = spec.load()(spec.options(), seq_len=4, eos_id=EOS, pad_id=0)
        out, _ = packed(packer, [np.array([1, 2, 3, EOS]), np.array([4, 5, EOS])])
        assert set(out) == {"input_ids", "labels"} | spec.emitted(spec.options())
