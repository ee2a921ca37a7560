"""The ``greedy`` packer: the conformance kit's invariants and its exact placement."""

import numpy as np

from forge_core.testing import pack_documents
from forge_plugin_example.greedy import GreedyPacker


def test_greedy_passes_the_conformance_kit(forge_conformance):
    report = forge_conformance.check_packer("greedy", lossless=True)
    assert report.emitted == {"doc_ids", "positions"}


def test_first_fit_places_documents_in_order():
    eos, pad = 9, 0
    packer = GreedyPacker(None, seq_len=5, eos_id=eos, pad_id=pad)
    # Lengths 3, 4, 2, 2: [1 2 9] fills row 0 to 3; [3 4 5 9] needs a new row; [6 9]
    # fits row 0; [7 9] row 2.
    layout = packer.layout(np.array([3, 4, 2, 2]))
    assert layout.rows == 3 and layout.starts.tolist() == [0, 7, 3, 9]
    docs = [np.array([1, 2, eos]), np.array([3, 4, 5, eos]), np.array([6, eos]), np.array([7, eos])]
    out = pack_documents(packer, docs)
    assert out["input_ids"].tolist() == [[1, 2, eos, 6, eos], [3, 4, 5, eos, pad], [7, eos, pad, pad, pad]]
    assert out["labels"].tolist() == [
        [2, eos, -100, eos, -100],
        [4, 5, eos, -100, -100],
        [eos, -100, -100, -100, -100],
    ]
    assert out["doc_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1], [0, 0, 1, 1, 1]]
    assert out["positions"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0], [0, 1, 0, 1, 2]]


def test_long_document_is_split_and_its_chunks_keep_their_labels():
    eos = 99
    out = pack_documents(
        GreedyPacker(None, seq_len=4, eos_id=eos, pad_id=0), [np.array(list(range(1, 7)) + [eos])]
    )
    assert out["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, eos, 0]]
    assert out["labels"].tolist() == [[2, 3, 4, 5], [6, eos, -100, -100]]
