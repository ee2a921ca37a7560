"""The per-token trainable mask: from a source's masked documents through the token
cache (``trainable.bin`` beside the ids) and every packer to the labels. A label is kept
only where the token it names is trainable; the EOS after a document is trainable iff
the document's last token is; unmasked data is unchanged bit for bit."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from forge_core.api import IGNORE_INDEX, INPUT_IDS, LABELS, ForgeError, MaskedDocument
from forge_core.api.unstable import Shards
from forge_core.data.build import source_shards
from forge_core.data.packed_rows import DocumentStream, PackedRows, check_layout, pack_documents
from forge_core.data.pipeline import document_hashes
from forge_core.data.shards import stream as document_stream
from forge_plugins.packers.bfd import BfdPacker
from forge_plugins.packers.concat import ConcatPacker
from forge_plugins.packers.none import NonePacker
from forge_plugins.packers.options import ConcatOptions
from forge_plugins.tokenizers.byte import ByteTokenizer

EOS, PAD = 9, 8


def all_packers(seq_len, eos=EOS, pad=PAD):
    return [
        BfdPacker(None, seq_len=seq_len, eos_id=eos, pad_id=pad),
        NonePacker(None, seq_len=seq_len, eos_id=eos, pad_id=pad),
        ConcatPacker(ConcatOptions(isolate=True), seq_len=seq_len, eos_id=eos, pad_id=pad),
        ConcatPacker(ConcatOptions(isolate=False), seq_len=seq_len, eos_id=eos, pad_id=pad),
    ]


def test_labels_of_a_hand_packed_row_follow_the_mask():
    # Document A: prompt 1, answer 2 3 (its EOS trainable); document B: all prompt.
    docs = [[1, 2, 3, EOS], [4, 5, EOS]]
    masks = [[0, 1, 1, 1], [0, 0, 0]]
    packer = BfdPacker(None, seq_len=8, eos_id=EOS, pad_id=PAD)
    plain = pack_documents(packer, docs)
    masked = pack_documents(packer, docs, trainable=masks)
    assert plain[INPUT_IDS].tolist() == masked[INPUT_IDS].tolist() == [[1, 2, 3, EOS, 4, 5, EOS, PAD]]
    assert plain[LABELS].tolist() == [[2, 3, EOS, -100, 5, EOS, -100, -100]]
    assert masked[LABELS].tolist() == [[2, 3, EOS, -100, -100, -100, -100, -100]]


def unique_stream(rng, masked):
    """Random documents (some empty) at scattered places of an array whose id at
    position k is k: a label names the array position of its token. EOS is appended."""
    n = int(rng.integers(1, 30))
    count = rng.integers(0, 12, n)
    start = np.cumsum(rng.integers(0, 3, n) + count) - count
    size = int(start[-1] + count[-1]) + 1
    tokens = np.arange(size, dtype=np.int64)
    mask = rng.integers(0, 2, size).astype(np.uint8) if masked else None
    eos = size + 5
    return DocumentStream(tokens, start, count, eos, vocab_size=size + 10, trainable=mask), eos


def reference_labels(out, stream, eos):
    """The masked labels from the unmasked ones: a kept label survives iff its token is
    trainable; an EOS label's token is the EOS of the input token's document."""
    labels = out[LABELS].copy()
    ids = out[INPUT_IDS]
    for index in np.ndindex(labels.shape):
        label = int(labels[index])
        if label == IGNORE_INDEX:
            continue
        if label != eos:
            keep = stream.trainable[label]
        elif int(ids[index]) != eos:
            keep = stream.trainable[int(ids[index])]  # the last token of the EOS's document
        else:
            keep = True  # the EOS of an empty document
        if not keep:
            labels[index] = IGNORE_INDEX
    return labels


@pytest.mark.parametrize("seed", range(6))
def test_random_streams_under_every_packer_match_the_token_by_token_reference(seed):
    rng = np.random.default_rng(seed)
    masked_stream, eos = unique_stream(rng, masked=True)
    m = masked_stream
    plain_stream = DocumentStream(m.tokens, m.start, m.count, eos, vocab_size=m.vocab_size)
    seq_len = int(rng.integers(2, 20))
    for packer in all_packers(seq_len, eos=eos, pad=eos + 1):
        layout = check_layout(packer.layout(plain_stream.lengths.copy()), plain_stream, seq_len, "test")
        if not layout.rows:
            continue
        rows = rng.permutation(layout.rows)[: int(rng.integers(1, layout.rows + 1))]
        plain = PackedRows(layout, plain_stream, eos_id=eos, pad_id=eos + 1).read(rows)
        masked = PackedRows(layout, masked_stream, eos_id=eos, pad_id=eos + 1).read(rows)
        assert set(plain) == set(masked)
        for key in plain:
            if key != LABELS:
                assert np.array_equal(plain[key], masked[key]), (type(packer).__name__, key)
        expected = reference_labels(plain, masked_stream, eos)
        assert np.array_equal(masked[LABELS], expected), type(packer).__name__


def test_an_all_trainable_mask_changes_nothing():
    rng = np.random.default_rng(7)
    docs = [np.append(rng.integers(0, 8, int(n)), EOS) for n in rng.integers(0, 15, 40)]
    for packer in all_packers(16):
        plain = pack_documents(packer, docs)
        ones = pack_documents(packer, docs, trainable=[np.ones(len(d)) for d in docs])
        assert plain.keys() == ones.keys()
        assert all(np.array_equal(plain[k], ones[k]) for k in plain), type(packer).__name__


class ListSource:
    def __init__(self, docs):
        self.docs = docs

    def documents(self):
        yield from self.docs

    def describe(self):
        return "list source"

    def fingerprint(self):
        return "list:" + document_hashes(self.docs).tobytes().hex()


def cached(source, tmp_path):
    from forge_core.config.schema import CacheSection

    byte = ByteTokenizer()
    shards, _ = source_shards(source, byte, CacheSection(dir=str(tmp_path)), "test", report=lambda m: None)
    return shards, document_stream(shards, byte.eos_id, byte.vocab_size)


def test_the_cache_stores_the_mask_beside_the_ids_and_the_rows_read_it(tmp_path):
    byte = ByteTokenizer()
    source = ListSource(["plain text", MaskedDocument([72, 105, 33], [True, False, True])])
    shards, stream = cached(source, tmp_path)
    assert shards.index["files"]["trainable"] == "trainable.bin"
    assert shards.index["num_trainable_tokens"] == len("plain text") + 2
    assert np.asarray(shards.trainable).tolist() == [1] * 10 + [1, 0, 1]
    packer = NonePacker(None, seq_len=12, eos_id=byte.eos_id, pad_id=byte.pad_id)
    rows = PackedRows(packer.layout(stream.lengths.copy()), stream, eos_id=byte.eos_id, pad_id=byte.pad_id)
    # A memory-mapped mask travels to loader workers as its file.
    again = pickle.loads(pickle.dumps(rows))
    assert isinstance(again.stream.trainable, np.memmap)
    out = again.read(np.arange(rows.num_rows))
    assert out[INPUT_IDS][1, :5].tolist() == [72, 105, 33, byte.eos_id, byte.pad_id]
    # 105 takes no loss; 33 does, and so does the EOS after it.
    assert out[LABELS][1, :5].tolist() == [-100, 33, byte.eos_id, -100, -100]
    assert out[LABELS][0, :11].tolist() == [*b"lain text", byte.eos_id, -100]


def test_unmasked_data_writes_no_mask_and_reads_as_before(tmp_path):
    shards, stream = cached(ListSource(["one document", "another one"]), tmp_path)
    assert set(shards.index["files"]) == {"tokens", "offsets", "hashes"}
    assert "num_trainable_tokens" not in shards.index
    assert shards.trainable is None and stream.trainable is None


def test_a_truncated_mask_file_is_refused(tmp_path):
    shards, _ = cached(ListSource([MaskedDocument([1, 2, 3], [0, 1, 1])]), tmp_path)
    with open(shards.path / "trainable.bin", "r+b") as f:
        f.truncate(2)
    with pytest.raises(ForgeError, match=r"trainable.bin: 2 bytes, the index says 3 tokens"):
        Shards(shards.path)


def test_a_masked_document_needs_one_flag_per_id():
    with pytest.raises(ValueError, match="3 token ids but 2 trainable flags"):
        MaskedDocument([1, 2, 3], [True, False])
