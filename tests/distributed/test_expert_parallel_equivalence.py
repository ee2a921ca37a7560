"""Expert parallelism equals one process (the MoE llama of :mod:`scenarios`: blocks 1 and
3 route over 4 experts, top 2, beside a shared expert; packed rows).

Two launches in the README's test command:

- 2 processes (:mod:`ep_exact`): the all-to-all with uneven splits and the dispatcher
  alone in float64; every parameter's gradient of the MoE llama under ``ep = 2`` in
  float64 on one batch, for both expert kernels (measured at most 3.7e-16 relative);
  then ``ep = 2`` training, with activation checkpointing, with a capacity factor that
  drops assignments, and with every balancing loss on (sequence-scope aux loss over
  packed documents, z-loss, the bias update; sigmoid router); and the negative control,
  a dispatcher sending tokens to the wrong rank.
- 4 processes (:mod:`scenarios`): ``ep = 4`` with a capacity factor, ep x fsdp, ep x tp,
  ep x cp, ep x pp (1F1B).

``pytest -m matrix`` adds ep = 2 with accumulation, the chunked loss and compile (with
and without activation checkpointing), plain ep = 4, ep x hsdp and ep x pp under every
other schedule.

Each layout trains 5 steps: per-step losses and gradient norms, the loss of a forward
after training, the evaluation loop's, and the final parameters (each gathered whole)
against one process. Tolerance as in :mod:`test_parallel_equivalence`: fp32, reduction
order only (measured at most 5.3e-8 relative on the final parameters); the control moves
the final parameters by 1.1e-3.
"""

from __future__ import annotations

import json

import pytest
from harness import HERE, run_scenarios, torchrun
from scenarios import PP_SCHEDULES
from test_parallel_equivalence import RTOL, assert_matches_reference

pytestmark = [pytest.mark.distributed, pytest.mark.numerical]

#: float64 rounding over the sums of a 4-layer model.
RTOL_FP64 = 1e-12
TWO = ["ep2", "ep2_ac", "ep2_capacity", "ep2_balanced"]
FOUR = ["ep4_capacity", "ep2_fsdp", "ep2_tp", "ep2_cp", "ep2_pp_1f1b"]
TWO_MATRIX = ["ep2_accum", "ep2_chunked", "ep2_compile", "ep2_ac_compile"]
#: Compiling, or several schedules on 4 processes, takes minutes on a loaded 2-core machine.
MATRIX_TIMEOUT = 900
FOUR_MATRIX = ["ep4", "ep2_hsdp", *(f"ep2_pp_{schedule}" for schedule in PP_SCHEDULES if schedule != "1f1b")]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep-two") / "out.json"
    proc = torchrun(2, HERE / "ep_exact.py", [str(out), *TWO, "ep2_wrong_rank"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return run_scenarios(4, FOUR, tmp_path_factory.mktemp("ep-four"))


def assert_trains_like_one_process(results, name):
    assert_matches_reference(results, name)
    got = results[name]
    ref = results[got["reference"]]
    assert len(got["loss"]) == 5
    assert got["eval_loop"]["loss"] == pytest.approx(ref["eval_loop"]["loss"], rel=RTOL)
    # Every process compared the final parameters it holds; together, every parameter.
    assert max(rank["parameters"][0] for rank in got["ranks"]) < RTOL
    counts = [rank["parameters"][1] for rank in got["ranks"]]
    if "pp" in name:  # ranks 0, 1 hold one pipeline rank's stages, ranks 2, 3 the other's
        assert counts[0] == counts[1] and counts[2] == counts[3] and counts[0] + counts[2] == 47, counts
    else:
        assert set(counts) == {47}, counts


def test_uneven_all_to_all_moves_rows_and_their_gradients_exactly(two):
    assert two["all_to_all"] == {"values": 0.0, "grads": 0.0}


def test_the_dispatcher_equals_one_process_for_outputs_and_every_gradient(two):
    got = dict(two["dispatch"])
    assert got.pop("block") == 0.0  # each rank kept its own contiguous block of experts
    assert set(got) == {"output", "x", "weights", "w1", "w2", "w3"}
    assert max(got.values()) < RTOL_FP64, got


def test_a_dispatcher_sending_tokens_to_the_wrong_rank_is_caught(two):
    got = two["wrong_rank"]
    assert min(got[key] for key in ("output", "x", "w1", "w2", "w3")) > 1e6 * RTOL_FP64, got


@pytest.mark.parametrize("kernel", ["grouped", "loop"])
def test_every_parameter_gradient_equals_one_process_in_float64(two, kernel):
    got = two[f"gradients_{kernel}"]
    assert (got["parameters"], got["expert_parameters"]) == (47, 6)  # 2 MoE blocks x w1, w2, w3
    assert got["worst"] < RTOL_FP64


@pytest.mark.parametrize("name", TWO)
def test_expert_parallel_on_two_processes_trains_like_one_process(two, name):
    assert_trains_like_one_process(two["scenarios"], name)


@pytest.mark.parametrize("launch, name", [("two", "ep2_capacity"), ("four", "ep4_capacity")])
def test_the_capacity_factor_drops_the_same_assignments_as_one_process(request, launch, name):
    results = request.getfixturevalue(launch)
    results = results.get("scenarios", results)  # the 2-process launch nests its scenarios
    got = results[name]
    ref = results[got["reference"]]
    # Every ep rank reads its own rows; together they dropped what one process dropped.
    assert sum(rank["dropped"] for rank in got["ranks"]) == ref["dropped"] > 0


def test_a_dispatcher_sending_tokens_to_the_wrong_rank_does_not_train_like_one_process(two):
    got = two["scenarios"]["ep2_wrong_rank"]
    assert min(rank["parameters"][0] for rank in got["ranks"]) > 100 * RTOL


@pytest.mark.parametrize("name", FOUR)
def test_expert_parallel_with_other_dimensions_trains_like_one_process(four, name):
    assert_trains_like_one_process(four, name)


@pytest.fixture(scope="module")
def two_matrix(tmp_path_factory):
    return run_scenarios(2, TWO_MATRIX, tmp_path_factory.mktemp("ep-two-matrix"), timeout=MATRIX_TIMEOUT)


@pytest.mark.matrix
@pytest.mark.parametrize("name", TWO_MATRIX)
def test_expert_parallel_compiled_accumulating_and_chunked_trains_like_one_process(two_matrix, name):
    assert_trains_like_one_process(two_matrix, name)


@pytest.fixture(scope="module")
def four_matrix(tmp_path_factory):
    # One launch per layout: all eight in one launch stopped making progress on the loaded
    # test machine (each passes alone in about 15 s; the cause is not found yet).
    results: dict = {}
    for name in FOUR_MATRIX:
        results.update(run_scenarios(4, [name], tmp_path_factory.mktemp(name), timeout=MATRIX_TIMEOUT))
    return results


@pytest.mark.matrix
@pytest.mark.parametrize("name", FOUR_MATRIX)
def test_expert_parallel_at_ep4_with_hsdp_and_under_every_pipeline_schedule_trains_like_one_process(
    four_matrix, name
):
    assert_trains_like_one_process(four_matrix, name)
