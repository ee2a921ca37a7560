"""What the built data keeps in memory per corpus token: the anonymous arrays (not the
memory-mapped ones) reachable from a run's rows and sources, counted exactly by their
``nbytes`` (not by RSS, which the allocator blurs), stay under 0.1 byte per token at the
shape of ``bench/data_scale.py`` (documents of about 500 tokens, rows of 256); and the
narrow storage of a layout never lets a sum overflow."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_bench

from forge_core.api import ForgeError, RowLayout
from forge_core.data.build import build_training_data
from forge_core.data.packed_rows import DocumentStream, check_layout
from forge_core.plan import make_plan
from forge_core.resolve import load_resolved
from forge_plugins.tokenizers.byte import ByteTokenizer

BYTE = ByteTokenizer()
bench = load_bench("data_scale.py")
anonymous_array_bytes = bench.anonymous_array_bytes


def test_the_counter_counts_heap_arrays_once_and_skips_memory_maps(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(1000))
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    heap = np.arange(100)
    assert anonymous_array_bytes({"m": mapped, "v": mapped[:-1], "h": [heap, heap[2:]]}) == heap.nbytes


@pytest.fixture(params=["concat", "bfd"])
def bench_shaped(tmp_path, request):
    """A text corpus of about 500-token documents (log-normal, as the bench's), rows of
    256 (the bench's ``concat``, and ``bfd``), through the token cache: the run's own
    build path."""
    rng = np.random.default_rng(0)
    lengths = np.maximum(2, np.rint(rng.lognormal(np.log(300), 1.0, 600))).astype(int)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": "x" * (n - 1)}) + "\n" for n in lengths))
    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(
            {
                "data": {
                    "source": "text",
                    "source_options": {"paths": [str(docs)]},
                    "tokenizer": "byte",
                    "packer": request.param,
                    "seq_len": 256,
                    "cache": {"dir": str(tmp_path / "cache")},
                }
            }
        )
    )
    cfg, registries = load_resolved(str(path))
    return make_plan(cfg, registries, 1), registries


def test_the_built_data_keeps_under_a_tenth_of_a_byte_per_corpus_token(bench_shaped):
    plan, registries = bench_shaped
    data = build_training_data(plan, registries, BYTE, report=lambda m: None)
    tokens = data.rows.stream.total
    assert tokens > 200_000 and data.rows.num_rows > 700
    # Before: 56 bytes a document (offsets and hashes read in, an index of every
    # document, the stream's five int64 arrays) and 24 a row (the layout in int64):
    # 0.18 bytes a token here. Now the stream's offsets (8 a document) and the layout
    # in int32 (12 a row): 0.06.
    per_token = anonymous_array_bytes(data) / tokens
    assert per_token < 0.1, f"{per_token:.3f} bytes of anonymous arrays per corpus token"
    layout = data.rows.layout
    assert {a.dtype for a in (layout.starts, layout.lengths, layout.row_ptr)} == {np.dtype(np.int32)}
    assert data.sources[0].train is None  # every document trains: no index of them


def test_a_layout_narrows_only_what_keeps_every_sum_of_two_exact():
    narrow = RowLayout(4, [0, 2**30 - 1], [1, 1], [0, 1, 2])
    assert narrow.starts.dtype == np.int32 and narrow.row_ptr.dtype == np.int32
    wide = RowLayout(4, [0, 2**30], [1, 1], [0, 1, 2])
    assert wide.starts.dtype == np.int64 and wide.lengths.dtype == np.int32
    assert RowLayout(4, [-(2**30) - 1, 0], [1, 1], [0, 1, 2]).starts.dtype == np.int64


def test_a_row_overfilled_past_int32_is_still_refused():
    # Three pieces of 2**30 - 1 tokens in one row, lengths stored int32: a sum kept in
    # int32 would wrap negative and pass the seq_len check (check_layout sums in int64).
    # No token is read, so none exists.
    big = 2**30 - 1
    stream = DocumentStream(np.zeros(1, np.uint8), [0], [3 * big], None)
    layout = RowLayout(64, [0, big, 2 * big], [big, big, big], [0, 3], boundaries="none")
    with pytest.raises(ForgeError, match=rf"a row holds {3 * big} tokens, more than seq_len 64"):
        check_layout(layout, stream, 64, "packer test")


@pytest.mark.parametrize("rows", [1, 7, 1000, 65_537])
def test_an_epoch_order_is_int32_and_the_same_permutation_as_before(rows):
    from forge_core.data.loader import epoch_order

    for seed, epoch in ((0, 0), (3, 5)):
        order = epoch_order(rows, seed, epoch, shuffle=True)
        assert order.dtype == np.int32
        assert np.array_equal(order, np.random.default_rng([seed, epoch]).permutation(rows))
    assert np.array_equal(epoch_order(rows, 0, 0, shuffle=False), np.arange(rows))
