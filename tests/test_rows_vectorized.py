"""Rows read over whole-batch runs equal the rows of the token-by-token gather they
replaced, bit for bit: random layouts (pieces inside documents, windows across them,
rows left empty or padded, metadata on and off) over random streams (empty documents,
EOS ids inside documents, PAD equal to EOS, EOS appended or stored, tokens not adjacent
in the array with damaged ids between them), any rows in any order; an id outside the
vocabulary inside a document is refused the same way. (The conformance kit over the
built-in packers is ``tests/test_conformance.py::test_builtin_packers_pass_the_kit``.)"""

from __future__ import annotations

import numpy as np
import pytest

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS, ForgeError, RowLayout
from forge_core.data.packed_rows import DocumentStream, PackedRows, check_layout, restart_counts

EOS, VOCAB, DAMAGED = 9, 10, 999


def reference_read(packed, rows):
    """``PackedRows.read`` before it worked on whole-batch runs: every placed token's
    stream position and output slot as arrays, then gather and scatter."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    L, S = packed.layout, packed.seq_len
    B = len(rows)
    lo = L.row_ptr[rows]
    counts = L.row_ptr[rows + 1] - lo
    first = np.zeros(B + 1, np.int64)
    np.cumsum(counts, out=first[1:])
    piece = np.repeat(lo - first[:-1], counts) + np.arange(first[-1], dtype=np.int64)
    plen = L.lengths[piece]
    # Column of each piece in its row: its offset among the row's pieces.
    pcum = np.zeros(len(piece) + 1, np.int64)
    np.cumsum(plen, out=pcum[1:])
    pcol = pcum[:-1] - np.repeat(pcum[first[:-1]], counts)
    prow = np.repeat(np.arange(B, dtype=np.int64), counts)
    # Every placed token: its stream position and its slot in the (B * S) output.
    within = restart_counts(pcum[:-1], int(pcum[-1])) if len(piece) else np.zeros(0, np.int64)
    src = np.repeat(L.starts[piece], plen) + within
    dest = np.repeat(prow * S + pcol, plen) + within

    tokens, last = packed.stream.gather(src)
    input_ids = np.full(B * S, packed.pad_id, np.int64)
    labels = np.full(B * S, IGNORE_INDEX, np.int64)
    input_ids[dest] = tokens
    # A token's next one is the next of its piece, but for a piece's last token,
    # gathered separately (one position per piece).
    following = np.empty_like(tokens)
    following[:-1] = tokens[1:]
    if len(piece):
        ends = np.minimum(L.starts[piece] + plen, max(packed.stream.total - 1, 0))
        following[pcum[1:] - 1] = packed.stream.gather(ends)[0]
    # The stream's last token has no next token.
    labelled = ~last if L.boundaries == "documents" else src + 1 < packed.stream.total
    labels[dest[labelled]] = following[labelled]
    eos_slots = dest[tokens == packed.eos_id] if L.boundaries == "eos" else dest[:0]
    labels[eos_slots] = IGNORE_INDEX
    out = {INPUT_IDS: input_ids.reshape(B, S), LABELS: labels.reshape(B, S)}
    if L.metadata:
        # A document starts at every piece, at the padding and (for 'eos') after an EOS.
        fill = np.bincount(prow, weights=plen, minlength=B).astype(np.int64)
        starts = np.zeros(B * S, bool)
        starts[prow * S + pcol] = True
        padded = np.flatnonzero(fill < S)
        starts[padded * S + fill[padded]] = True
        after = eos_slots + 1
        starts[after[after % S != 0]] = True
        starts[np.arange(B) * S] = True
        out[DOC_IDS] = np.cumsum(starts.reshape(B, S), axis=1, dtype=np.int64) - 1
        out[POSITIONS] = restart_counts(np.flatnonzero(starts), B * S).reshape(B, S)
    return out


def random_stream(rng, tmp_path, appended):
    """Documents (some empty) at random places of a memory-mapped array, with damaged
    ids in the gaps between them; EOS appended on read, or stored as each one's last id."""
    n_docs = int(rng.integers(1, 40))
    count = rng.integers(0, 30, n_docs) if appended else rng.integers(1, 30, n_docs)
    gaps = rng.integers(0, 3, n_docs)
    start = np.cumsum(gaps + count) - count
    flat = np.full(int(start[-1] + count[-1] + rng.integers(0, 3)), DAMAGED, np.uint16)
    for s, c in zip(start, count):
        flat[s : s + c] = rng.integers(0, VOCAB, c)  # EOS ids inside documents too
        if not appended:
            flat[s + c - 1] = EOS if rng.random() < 0.9 else flat[s + c - 1]
    path = tmp_path / f"tokens-{rng.integers(1 << 30)}.bin"
    flat.tofile(path)
    tokens = np.memmap(path, dtype=np.uint16, mode="r", shape=flat.shape)
    return DocumentStream(tokens, start, count, EOS if appended else None, vocab_size=VOCAB)


def random_layout(rng, stream, seq_len, boundaries, metadata):
    """Pieces cut at random (and at documents for 'documents'), some left out, placed
    into rows in random order; some rows only padding."""
    cuts = set(rng.integers(0, stream.total + 1, int(rng.integers(0, stream.total + 1))).tolist())
    if boundaries == "documents":
        cuts |= set(stream.offsets.tolist())
    edges = sorted(cuts | {0, stream.total})
    pieces = []
    for a, b in zip(edges[:-1], edges[1:]):
        for s in range(a, b, seq_len):
            pieces.append((s, min(b, s + seq_len)))
    keep = [p for p in pieces if rng.random() < 0.85]
    rng.shuffle(keep)
    starts, lengths, rows_of, cols_of, row, col = [], [], [], [], 0, 0
    for s, e in keep:
        if col + (e - s) > seq_len or rng.random() < 0.1:
            row, col = row + 1 + int(rng.random() < 0.2), 0
        starts.append(s), lengths.append(e - s), rows_of.append(row), cols_of.append(col)
        col += e - s
    return RowLayout.from_placement(
        seq_len,
        starts,
        lengths,
        rows_of,
        cols_of,
        rows=row + 1 + int(rng.integers(0, 2)),
        boundaries=boundaries,
        metadata=metadata,
    )


@pytest.mark.numerical
@pytest.mark.parametrize("boundaries", ["documents", "eos", "none"])
@pytest.mark.parametrize("appended", [True, False])
def test_batch_runs_equal_the_per_token_gather(tmp_path, boundaries, appended):
    rng = np.random.default_rng([ord(boundaries[0]), appended])
    for trial in range(40):
        stream = random_stream(rng, tmp_path, appended)
        seq_len = int(rng.integers(1, 24))
        metadata = boundaries != "none" and bool(rng.random() < 0.7)
        layout = check_layout(random_layout(rng, stream, seq_len, boundaries, metadata), stream, seq_len, "p")
        pad = EOS if rng.random() < 0.3 else 0
        rows = PackedRows(layout, stream, eos_id=EOS, pad_id=pad)
        picks = [np.arange(rows.num_rows), rng.integers(0, rows.num_rows, int(rng.integers(0, 9))), []]
        for pick in picks:
            got, want = rows.read(pick), reference_read(rows, pick)
            assert list(got) == list(want), (trial, boundaries)
            for key in want:
                assert got[key].dtype == np.int64 and got[key].shape == want[key].shape, (trial, key)
                assert np.array_equal(got[key], want[key]), (trial, boundaries, appended, key, pick)


def test_an_id_outside_the_vocabulary_is_refused_as_before(tmp_path):
    """A damaged id inside a document is refused naming it (the same error as the gather
    of before); damaged ids between documents are never read, so never refused."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        stream = random_stream(rng, tmp_path, appended=True)
        layout = RowLayout.windows(8, stream.total // 8, boundaries="eos", metadata=True)
        rows = PackedRows(layout, stream, eos_id=EOS, pad_id=0)
        everything = np.arange(rows.num_rows)
        assert np.array_equal(rows.read(everything)[INPUT_IDS], reference_read(rows, everything)[INPUT_IDS])
        inside = np.flatnonzero(stream.count[: int(np.searchsorted(stream.offsets, 8 * rows.num_rows)) - 1])
        if not inside.size:
            continue
        d = int(rng.choice(inside))
        tokens = np.array(stream.tokens)
        tokens[stream.start[d] + rng.integers(0, stream.count[d])] = 12
        broken = DocumentStream(
            tokens, stream.start, stream.count, EOS, vocab_size=VOCAB, where="x/tokens.bin"
        )
        broken_rows = PackedRows(layout, broken, eos_id=EOS, pad_id=0)
        with pytest.raises(ForgeError) as want:
            reference_read(broken_rows, everything)
        with pytest.raises(ForgeError, match="x/tokens.bin: document .* holds token id 12") as got:
            broken_rows.read(everything)
        assert str(got.value) == str(want.value)
