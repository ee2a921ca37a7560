"""DPO under data parallelism trains exactly like one process: in float64, after two
steps of the trainer's own step under ddp, fsdp and fsdp with gradient accumulation,
every parameter equals the single process's to rounding (measured 5e-16 relative) and
so do the DPO metrics, the pairs counted over every rank as the normalizer; a rank that
counts its pairs twice is caught (measured 0.39). One 2-process launch
(:mod:`dpo_worker`)."""

from __future__ import annotations

import json

import pytest
from harness import HERE, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.numerical]

#: float64 sums over a 4-layer model, reduced in another order: a few hundred ulps.
RTOL = 1e-12
#: The step's loss and gradient norm are reported in float32 (the step accumulates and
#: returns them so): a few float32 ulps.
REPORTED = 1e-6
METRICS = ["dpo/reward_accuracy", "dpo/chosen_reward", "dpo/rejected_reward", "dpo/reward_margin"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("dpo-parallel") / "out.json"
    proc = torchrun(2, HERE / "dpo_worker.py", [str(out)])
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_the_reference_run_moves(measured):
    """The comparison has something to compare: the first step starts at log 2 (policy
    == reference) and the second has moved away from it."""
    first, second = measured["one_process"]
    assert first["loss"] == pytest.approx(0.6931471805599453, rel=REPORTED)
    assert abs(second["loss"] - first["loss"]) > 1e-3 and second["dpo/reward_margin"] > 1e-3


@pytest.mark.parametrize("layout", ["ddp", "fsdp", "fsdp_accum"])
def test_data_parallel_dpo_equals_one_process_in_float64(measured, layout):
    got = measured[layout]
    assert got["parameters"] < RTOL
    for step, want in zip(got["steps"], measured["one_process"], strict=True):
        for key in METRICS:
            assert step[key] == pytest.approx(want[key], rel=1e-10, abs=1e-15), (layout, key)
        assert step["loss"] == pytest.approx(want["loss"], rel=REPORTED)
        assert step["norm"] == pytest.approx(want["norm"], rel=REPORTED)


def test_a_rank_that_miscounts_its_pairs_is_caught(measured):
    assert measured["ddp_miscounted"]["parameters"] > 1e6 * RTOL
