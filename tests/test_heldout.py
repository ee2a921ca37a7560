"""The held-out split: deterministic, document-level, by content (stable when the corpus
grows, identical documents on one side), sized by the fraction; a training build never
packs a held-out document and heldout_documents gives exactly those to an evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from forge_core.data.build import build_training_data, heldout_documents
from forge_core.data.heldout import heldout_mask
from forge_core.data.pipeline import document_hashes
from forge_core.plan import make_plan
from forge_core.resolve import load_resolved
from forge_plugins.tokenizers.byte import ByteTokenizer

BYTE = ByteTokenizer()


def texts(n, start=0):
    return [f"document number {i}: " + "x" * (i % 17) for i in range(start, start + n)]


def test_the_split_is_deterministic_sized_and_seeded():
    hashes = document_hashes(texts(20_000))
    held = heldout_mask(hashes, 0.1, seed=0)
    assert np.array_equal(held, heldout_mask(hashes, 0.1, seed=0))
    # Binomial(20000, 0.1): standard deviation 42 documents; 5 sigma.
    assert abs(int(held.sum()) - 2000) < 5 * 42
    other = heldout_mask(hashes, 0.1, seed=1)
    assert abs(int(other.sum()) - 2000) < 5 * 42 and (other != held).sum() > 1000
    assert not heldout_mask(hashes, 0.0, 0).any() and heldout_mask(hashes, 1.0, 0).all()
    # A larger fraction holds out a superset (one threshold over the same mixed hashes).
    assert not (held & ~heldout_mask(hashes, 0.2, seed=0)).any()


def test_documents_keep_their_side_when_the_corpus_grows_and_duplicates_share_one():
    old = texts(1000)
    grown = texts(300, start=5000) + old[:500] + texts(300, start=9000) + old[500:]
    held_old = dict(zip(old, heldout_mask(document_hashes(old), 0.2, 3)))
    held_grown = dict(zip(grown, heldout_mask(document_hashes(grown), 0.2, 3)))
    assert all(held_grown[t] == side for t, side in held_old.items())
    dup = old[:50] * 3
    mask = heldout_mask(document_hashes(dup), 0.5, 0)
    assert all(len({bool(m) for t2, m in zip(dup, mask) if t2 == t}) == 1 for t in old[:50])


@pytest.fixture
def config(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(400)))
    path = tmp_path / "c.yaml"
    path.write_text(
        json.dumps(
            {
                "data": {
                    "source": "text",
                    "source_options": {"paths": [str(docs)]},
                    "tokenizer": "byte",
                    "packer": "bfd",
                    "seq_len": 64,
                    "heldout": {"fraction": 0.25, "seed": 7},
                    "cache": {"dir": str(tmp_path / "cache")},
                }
            }
        )
    )
    cfg, registries = load_resolved(str(path))
    return make_plan(cfg, registries, 1), registries


def test_training_never_sees_a_held_out_document_and_evaluation_gets_exactly_those(config):
    plan, registries = config
    data = build_training_data(plan, registries, BYTE, report=lambda m: None)
    part = data.sources[0]
    held = set(part.heldout.tolist())
    assert held and not held & set(part.train.tolist())
    assert len(held) + len(part.train) == part.shards.num_documents == 400
    # bfd keeps every token: the rows hold exactly the training documents' tokens.
    rows = data.rows.read(np.arange(data.rows.num_rows))
    lengths = np.diff(part.shards.offsets)
    assert int((rows["input_ids"] != BYTE.pad_id).sum()) == int(lengths[part.train].sum() + len(part.train))
    expected = heldout_mask(part.shards.hashes, 0.25, 7)
    assert np.array_equal(np.flatnonzero(expected), part.heldout)
    assert "held out" in data.summary and f"{len(held):,} of 400 documents" in data.summary
    ((label, stream),) = heldout_documents(plan, registries, BYTE)
    assert label == "text" and len(stream) == len(held)
    first = stream.gather(np.arange(stream.offsets[0], stream.offsets[1]))[0]
    assert bytes(first[:-1].astype(np.uint8)).decode() == texts(400)[int(part.heldout[0])]
    assert first[-1] == BYTE.eos_id
