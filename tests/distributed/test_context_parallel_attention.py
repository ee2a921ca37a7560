"""Context-parallel attention over two CPU processes (torchrun, gloo) equals one process
in float64: the output and the gradients of ``q``, ``k``, ``v`` of every built-in backend
(sdpa, eager, flex), in both cp attention modes (allgather, ulysses), on packed rows and
plain causal ones. One launch runs every case (:mod:`cp_attention_worker`)."""

from __future__ import annotations

import json

import pytest
from harness import HERE, torchrun

pytestmark = pytest.mark.distributed

BACKENDS = ("eager", "sdpa", "flex")
MODES = ("allgather", "ulysses")
ROWS = ("packed", "causal", "packed-per-row")
#: float64 rounding of a 64-key softmax and its gradient, with room to spare.
EXACT = 1e-12


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp-attention") / "results.json"
    proc = torchrun(2, HERE / "cp_attention_worker.py", [str(out)], timeout=180)
    if proc.returncode != 0 or not out.is_file():
        pytest.fail(f"torchrun exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-8000:]}")
    return json.loads(out.read_text())


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_attention_and_its_gradients_equal_one_process(ranks, backend, mode, rows):
    for rank, results in enumerate(ranks):
        errors = results[f"{backend}-{mode}-{rows}"]
        assert set(errors) == {"out", "dq", "dk", "dv"}
        assert max(errors.values()) <= EXACT, f"rank {rank}: {errors}"


@pytest.mark.parametrize("mode", MODES)
def test_compiled_sharded_attention_equals_one_process(ranks, mode):
    for rank, results in enumerate(ranks):
        errors = results[f"sdpa-{mode}-packed-compiled"]
        assert set(errors) == {"out", "dq", "dk", "dv"}
        assert max(errors.values()) <= EXACT, f"rank {rank}: {errors}"


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cp_attention_that_drops_other_ranks_keys_fails_the_comparison(ranks, backend, rows):
    # The negative control: the same measurement sees the keys of the other rank missing,
    # in the output and in every gradient, on every rank.
    for rank, results in enumerate(ranks):
        errors = results[f"{backend}-allgather-{rows}-drops-other-ranks-keys"]
        assert min(errors.values()) > 1e-2, f"rank {rank}: {errors}"


def test_ulysses_refuses_key_heads_that_do_not_divide_by_cp(ranks):
    for results in ranks:
        assert results["ulysses-indivisible-kv-heads"] == (
            "cp attention 'ulysses' needs key/value heads (1) divisible by cp (2): use attention 'allgather'"
        )


def test_doc_ids_split_by_another_rule_are_refused(ranks):
    for rank, results in enumerate(ranks):
        assert results["contiguous-shards"] == (
            f"cp rank {rank}: the doc_ids it holds are not its 'zigzag' share of the row gathered over "
            "the cp group: doc_ids must never decrease along a row (the packer's contract) and the batch "
            "must be split with the same balancer"
        )


def test_the_sequence_gather_concatenates_the_ranks_in_order(ranks):
    assert [r["gather-ids"] for r in ranks] == [[[0, 1, 2, 10, 11, 12]]] * 2
