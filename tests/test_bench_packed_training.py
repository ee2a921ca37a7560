"""The pure parts of ``bench/packed_training.py`` at a tiny size: the packed row's labels
never cross a document's end, the transformers side's 4-D mask is block-diagonal and
causal, the equality check passes for Forge and transformers on the same weights and
stops the bench when the transformers side attends across documents, and the report
reads its rounds. (flex is left out here: its compile takes most of a minute on a busy
machine; ``python bench/packed_training.py --quick`` runs it.)"""

from __future__ import annotations

import pytest
import torch
from conftest import load_bench

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS

bench = load_bench("packed_training.py")

TINY = [
    "--dim",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--kv-heads",
    "1",
    "--vocab",
    "64",
    "--median-doc",
    "8",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_packed_row_labels_stop_at_every_document_end():
    row = bench.packed_row(64, vocab=64, median=8, seed=5)
    doc_ids, positions, labels = row[DOC_IDS][0], row[POSITIONS][0], row[LABELS][0]
    assert int(doc_ids.max()) >= 3, "the row must hold several documents"
    for t in range(63):
        crosses = bool(doc_ids[t + 1] != doc_ids[t])
        assert (labels[t] == IGNORE_INDEX) == crosses and (positions[t + 1] == 0) == crosses
        if not crosses:
            assert labels[t] == row[INPUT_IDS][0, t + 1]
    assert labels[63] != IGNORE_INDEX  # the row's last document is cut, not ended


def test_the_4d_mask_lets_a_token_see_its_own_document_up_to_itself():
    doc_ids = torch.tensor([[0, 0, 1, 1, 1, 2]])
    mask = bench.block_diagonal_mask(doc_ids)
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.bool
    want = [[doc_ids[0, q] == doc_ids[0, k] and k <= q for k in range(6)] for q in range(6)]
    assert mask[0, 0].tolist() == [[bool(x) for x in row] for row in want]


def test_forge_and_transformers_compute_the_same_loss_on_the_packed_row():
    args = bench.parse(TINY)
    batch = bench.packed_row(64, args.vocab, args.median_doc, seed=1)
    ways = bench.forwards(args, 64, ["forge sdpa", "hf 4-D mask"])
    losses = bench.check_same(ways, batch, torch.float32)
    assert set(losses) == {"forge sdpa", "hf 4-D mask"}
    assert losses["forge sdpa"] == pytest.approx(losses["hf 4-D mask"], rel=1e-5)


def test_a_transformers_side_that_attends_across_documents_stops_the_bench(monkeypatch):
    args = bench.parse(TINY)
    batch = bench.packed_row(64, args.vocab, args.median_doc, seed=1)
    ways = bench.forwards(args, 64, ["forge sdpa", "hf 4-D mask"])
    # The causal mask alone: what a user gets who forgets the block-diagonal part.
    isolating = bench.block_diagonal_mask
    monkeypatch.setattr(bench, "block_diagonal_mask", lambda doc_ids: isolating(torch.zeros_like(doc_ids)))
    with pytest.raises(AssertionError, match="hf 4-D mask: logits"):
        bench.check_same(ways, batch, torch.float32)


def test_a_training_step_of_each_way_and_the_report():
    args = bench.parse(TINY + ["--pairs", "3", "--no-peak", "--sides", "forge sdpa", "hf 4-D mask"])
    result = bench.measure(args, 64, args.sides)
    assert all(len(t["wall"]) == 3 for t in result["times"].values())
    lines = bench.report(result, 64)
    assert "A = forge sdpa" in lines[0] and "(checked)" in lines[0]
    assert lines[2].split()[:2] == ["forge", "sdpa"] and lines[2].split()[-3:] == ["1.00", "1.00", "n/a"]
    assert lines[3].startswith("  hf 4-D mask")
