"""Expert parallelism's all-to-all and dispatcher alone, under torchrun (2 CPU processes,
gloo), in float64: uneven splits move rows and their gradients exactly; tokens routed
over two ranks' experts give one process's outputs and gradients to rounding; a
dispatcher sending tokens to the wrong rank is caught."""

from __future__ import annotations

import json

import pytest
from harness import HERE, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.numerical]

#: float64 rounding of a few sums of a handful of products.
RTOL = 1e-12


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep-dispatch") / "out.json"
    proc = torchrun(2, HERE / "ep_dispatch.py", [str(out)])
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_uneven_all_to_all_moves_rows_and_their_gradients_exactly(measured):
    assert measured["all_to_all"] == {"values": 0.0, "grads": 0.0}


def test_the_dispatcher_equals_one_process_for_outputs_and_every_gradient(measured):
    got = measured["dispatch"]
    assert got.pop("block") == 0.0  # each rank kept its own contiguous block of experts
    assert set(got) == {"output", "x", "weights", "w1", "w2", "w3"}
    assert max(got.values()) < RTOL, got


def test_a_dispatcher_sending_tokens_to_the_wrong_rank_is_caught(measured):
    got = measured["wrong_rank"]
    assert min(got[key] for key in ("output", "x", "w1", "w2", "w3")) > 1e6 * RTOL, got
