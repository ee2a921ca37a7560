"""The stateful loader: deterministic order, disjoint data-parallel shards, exact resume
mid-epoch with and without worker processes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from forge_core.api import ForgeError
from forge_core.data.loader import StatefulLoader

SEQ = 3


def make_rows(n):
    # Row r holds r in every position, so a batch tells which rows it came from.
    ids = np.repeat(np.arange(n, dtype=np.int64), SEQ).reshape(n, SEQ)
    return {"input_ids": ids, "labels": ids + 1000, "doc_ids": ids * 0}


def row_ids(batch):
    return batch["input_ids"][:, 0].tolist()


def take(loader, n):
    return [row_ids(b) for b in itertools.islice(loader, n)]


def test_batches_are_int64_tensors_of_all_keys():
    loader = StatefulLoader(make_rows(10), 4, seed=1)
    batch = next(loader)
    assert set(batch) == {"input_ids", "labels", "doc_ids"}
    assert all(v.dtype == torch.int64 and v.shape == (4, SEQ) for v in batch.values())
    assert torch.equal(batch["labels"], batch["input_ids"] + 1000)  # rows stay whole


def test_order_is_seeded_and_changes_every_epoch():
    a = take(StatefulLoader(make_rows(20), 5, seed=3), 8)
    assert a == take(StatefulLoader(make_rows(20), 5, seed=3), 8)
    assert a != take(StatefulLoader(make_rows(20), 5, seed=4), 8)
    epoch0, epoch1 = sum(a[:4], []), sum(a[4:], [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(20)) and epoch0 != epoch1
    assert take(StatefulLoader(make_rows(20), 5, shuffle=False), 4) == [
        list(range(i, i + 5)) for i in range(0, 20, 5)
    ]


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_dp_shards_are_disjoint_equal_and_cover_the_epoch(dp_size):
    n, batch = 23, 2
    per_epoch = n // (batch * dp_size)
    loaders = [
        StatefulLoader(make_rows(n), batch, dp_rank=r, dp_size=dp_size, seed=7) for r in range(dp_size)
    ]
    assert all(loader.batches_per_epoch == per_epoch for loader in loaders)
    seen = [sum(take(loader, per_epoch), []) for loader in loaders]
    flat = sum(seen, [])
    assert len(flat) == len(set(flat)) == per_epoch * batch * dp_size  # disjoint
    assert len(flat) > n - batch * dp_size  # only the remainder of a global batch is skipped
    # One global batch is the same rows whatever the split across ranks.
    single = take(StatefulLoader(make_rows(n), batch * dp_size, seed=7), per_epoch)
    assert [sorted(sum((s[b * batch : (b + 1) * batch] for s in seen), [])) for b in range(per_epoch)] == [
        sorted(x) for x in single
    ]


def test_ranks_passing_the_same_dp_rank_get_the_same_batches():
    # Every pipeline stage / tensor-parallel rank of a DP group passes its group's dp_rank.
    a = take(StatefulLoader(make_rows(30), 3, dp_rank=1, dp_size=2, seed=5), 12)
    b = take(StatefulLoader(make_rows(30), 3, dp_rank=1, dp_size=2, seed=5, num_workers=1), 12)
    assert a == b


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [3, 5, 11])  # mid-epoch, at an epoch boundary, in epoch 2
def test_resume_yields_exactly_the_uninterrupted_batches(workers, stop):
    rows = make_rows(26)  # 5 batches of 5 per epoch, one row skipped
    reference = take(StatefulLoader(rows, 5, seed=11), 16)
    first = StatefulLoader(rows, 5, seed=11, num_workers=workers)
    assert take(first, stop) == reference[:stop]
    state = first.state_dict()
    next(first)  # the interrupted run may have gone on (and prefetched) after saving
    first.close()
    resumed = StatefulLoader(rows, 5, seed=11, num_workers=workers)
    resumed.load_state_dict(state)
    assert take(resumed, 16 - stop) == reference[stop:]
    resumed.close()


def test_state_counts_epoch_and_batches():
    loader = StatefulLoader(make_rows(10), 3, seed=0)  # 3 batches per epoch
    take(loader, 4)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (1, 1)


def test_resume_refuses_different_data_or_batch():
    state = StatefulLoader(make_rows(20), 5, seed=1).state_dict()
    for other in (
        StatefulLoader(make_rows(21), 5, seed=1),
        StatefulLoader(make_rows(20), 4, seed=1),
        StatefulLoader(make_rows(20), 5, seed=2),
    ):
        with pytest.raises(ForgeError, match="cannot resume the data loader"):
            other.load_state_dict(state)
    # The same global batch split over two ranks instead of one: allowed.
    single = StatefulLoader(make_rows(20), 4, seed=1)
    take(single, 2)
    split = StatefulLoader(make_rows(20), 2, dp_rank=1, dp_size=2, seed=1)
    split.load_state_dict(single.state_dict())
    assert row_ids(next(split)) == row_ids(next(single))[2:]


def test_fewer_rows_than_a_global_batch_is_an_error():
    with pytest.raises(ForgeError, match="fewer than one global batch of 8"):
        StatefulLoader(make_rows(7), 4, dp_size=2)
