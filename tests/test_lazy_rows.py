"""Lazy rows equal the eager rows of before, bit for bit: for ``none``, ``concat``
(isolating and not) and ``bfd``, every row read from a layout over a memory-mapped
stream (EOS appended on the fly) equals what the eager ``pack(documents)`` of before
built, on random corpora (short and long documents, EOS ids inside documents, PAD equal
to EOS), whichever rows a batch asks for and in whatever order; and the kernel's check
refuses layouts that break the contract."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from eager_reference import EagerBfd, EagerConcat, EagerNone

from forge_core.api import ForgeError, RowLayout
from forge_core.data.packed_rows import DocumentStream, PackedRows, check_layout, pack_documents
from forge_plugins.packers.bfd import BfdPacker
from forge_plugins.packers.concat import ConcatPacker
from forge_plugins.packers.none import NonePacker
from forge_plugins.packers.options import ConcatOptions

EOS = 9


def corpus(rng, seq_len, n_docs):
    """Documents without EOS (as a shard stores them); ids 0-9 so EOS also occurs inside."""
    lengths = np.maximum(0, rng.lognormal(np.log(seq_len / 2), 1.2, n_docs).astype(int))
    return [rng.integers(0, 10, n).astype(np.uint16) for n in lengths]


def pairs(seq_len, eos, pad):
    kw = dict(seq_len=seq_len, eos_id=eos, pad_id=pad)
    return {
        "none": (NonePacker(None, **kw), EagerNone(seq_len, eos, pad)),
        "concat": (ConcatPacker(ConcatOptions(), **kw), EagerConcat(seq_len, eos, pad)),
        "concat-plain": (
            ConcatPacker(ConcatOptions(isolate=False), **kw),
            EagerConcat(seq_len, eos, pad, isolate=False),
        ),
        "bfd": (BfdPacker(None, **kw), EagerBfd(seq_len, eos, pad)),
    }


def memmapped_stream(tmp_path, docs, eos):
    """A DocumentStream over a real memory map, EOS appended on read, as a run reads shards."""
    flat = np.concatenate(docs) if docs else np.zeros(0, np.uint16)
    path = tmp_path / "tokens.bin"
    flat.tofile(path)
    tokens = np.memmap(path, dtype=np.uint16, mode="r", shape=(flat.size,)) if flat.size else flat
    count = np.array([len(d) for d in docs], np.int64)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    return DocumentStream(tokens, start, count, eos, vocab_size=10)


@pytest.mark.numerical
@pytest.mark.parametrize("name", ["none", "concat", "concat-plain", "bfd"])
@pytest.mark.parametrize("pad", [0, EOS])
def test_lazy_rows_equal_the_eager_rows_bit_for_bit(tmp_path, name, pad):
    rng = np.random.default_rng([zlib.crc32(name.encode()), pad])
    for trial in range(12):
        seq_len = int(rng.integers(1, 40))
        docs = corpus(rng, seq_len, int(rng.integers(1, 120)))
        with_eos = [np.append(d.astype(np.int32), np.int32(EOS)) for d in docs]
        lazy, eager = pairs(seq_len, EOS, pad)[name]
        want = eager.pack([d.copy() for d in with_eos])
        stream = memmapped_stream(tmp_path, docs, EOS)
        layout = check_layout(lazy.layout(stream.lengths.copy()), stream, seq_len, name)
        rows = PackedRows(layout, stream, eos_id=EOS, pad_id=pad)
        assert rows.num_rows == want["input_ids"].shape[0]
        assert set(rows.keys) == set(want)
        got = rows.read(np.arange(rows.num_rows))
        for key in want:
            assert got[key].dtype == np.int64 and np.array_equal(got[key], want[key]), (name, trial, key)
        if rows.num_rows:
            pick = rng.integers(0, rows.num_rows, min(7, 2 * rows.num_rows))  # repeats, any order
            part = rows.read(pick)
            for key in want:
                assert np.array_equal(part[key], want[key][pick]), (name, trial, key)
        # And the in-memory helper gives the same rows.
        again = pack_documents(lazy, with_eos)
        assert all(np.array_equal(again[k], want[k]) for k in want)
        for key, value in eager.stats.items():
            assert rows.stats[key] == pytest.approx(value), (name, key)


def test_stream_appends_eos_and_checks_the_vocabulary(tmp_path):
    docs = [np.array([1, 2], np.uint16), np.array([], np.uint16), np.array([3], np.uint16)]
    stream = memmapped_stream(tmp_path, docs, EOS)
    assert stream.lengths.tolist() == [3, 1, 2] and stream.total == 6
    tokens, last = stream.gather(np.arange(6))
    assert tokens.tolist() == [1, 2, EOS, EOS, 3, EOS]
    assert last.tolist() == [False, False, True, True, False, True]
    bad = DocumentStream(
        np.array([1, 12], np.uint16),
        np.array([0, 1]),
        np.array([1, 1]),
        EOS,
        vocab_size=10,
        where="x/tokens.bin",
    )
    with pytest.raises(
        ForgeError,
        match=r"x/tokens\.bin: document 1 holds token id 12, outside the tokenizer's vocabulary of 10",
    ):
        bad.gather(np.arange(4))


def layout(**fields):
    base = dict(seq_len=4, starts=[0, 3], lengths=[3, 2], row_ptr=[0, 1, 2], boundaries="documents")
    return RowLayout(**{**base, **fields})


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"seq_len": 5}, "seq_len 5, the run's data.seq_len is 4"),
        ({"row_ptr": [0, 2, 1]}, "row_ptr must start at 0"),
        ({"lengths": [3, 0]}, "piece 1 is empty"),
        ({"starts": [0, 4]}, "a piece lies outside the stream of 5 tokens"),
        ({"starts": [0, 2]}, "pieces overlap at stream position 2"),
        ({"lengths": [5, 2]}, "a row holds 5 tokens, more than seq_len 4"),
        ({"starts": [0, 2], "lengths": [2, 3]}, "piece 1 runs past the end of document 0"),
        ({"boundaries": "none", "metadata": True}, "metadata needs boundaries"),
    ],
)
def test_check_layout_names_the_broken_promise(fields, message):
    stream = DocumentStream.from_documents([np.array([1, 2, EOS]), np.array([3, EOS])])
    check_layout(layout(), stream, 4, "packer p")  # the base layout is fine
    with pytest.raises(ForgeError, match=f"packer p: layout\\(\\) broke the packer contract: {message}"):
        check_layout(layout(**fields), stream, 4, "packer p")


def test_from_placement_sorts_pieces_and_refuses_gaps():
    got = RowLayout.from_placement(4, [5, 0, 2], [1, 2, 2], [1, 0, 0], [0, 0, 2])
    assert got.starts.tolist() == [0, 2, 5] and got.row_ptr.tolist() == [0, 2, 3]
    with pytest.raises(
        ValueError, match="row 0: a piece at column 3 where the row's pieces so far end at column 2"
    ):
        RowLayout.from_placement(4, [0, 2], [2, 1], [0, 0], [0, 3])
    empty_rows = RowLayout.from_placement(4, [0], [2], [2], [0], rows=4)
    assert empty_rows.row_ptr.tolist() == [0, 0, 0, 1, 1]


def test_rows_travel_to_worker_processes_without_their_tokens(tmp_path):
    import pickle

    docs = [np.arange(5000, dtype=np.uint16) % 10 for _ in range(40)]
    stream = memmapped_stream(tmp_path, docs, EOS)
    rows = PackedRows(
        ConcatPacker(ConcatOptions(), seq_len=16, eos_id=EOS, pad_id=0).layout(stream.lengths),
        stream,
        eos_id=EOS,
        pad_id=0,
    )
    assert len(pickle.dumps(stream)) < 5000  # per-document arrays and the file name, not 400 KB of tokens
    again = pickle.loads(pickle.dumps(rows))
    assert isinstance(again.stream.tokens, np.memmap)
    pick = np.array([3, 0, 99])
    assert all(np.array_equal(again.read(pick)[k], rows.read(pick)[k]) for k in rows.keys)
