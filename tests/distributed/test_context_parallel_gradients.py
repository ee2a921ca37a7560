"""Context parallelism is exact: in float64, after one forward and backward of one packed
batch, every parameter's gradient under cp = 2 (sdpa and eager, both attention modes)
equals one process's to rounding (measured at most 4.5e-16 relative), and a cp
attention that drops the other rank's keys is caught (measured 0.83)."""

from __future__ import annotations

import json

import pytest
from harness import HERE, torchrun

pytestmark = pytest.mark.distributed

#: float64 rounding over the sums of a 4-layer model: a few hundred ulps at most.
RTOL = 1e-12


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp-gradients") / "out.json"
    proc = torchrun(2, HERE / "cp_gradients.py", [str(out)])
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", ["sdpa_allgather", "sdpa_ulysses", "eager_allgather", "eager_ulysses"])
def test_every_parameter_gradient_equals_one_process_in_float64(measured, case):
    assert measured[case]["parameters"] == 39  # every parameter of the model was compared
    assert measured[case]["worst"] < RTOL


def test_an_attention_that_drops_the_other_ranks_keys_is_caught(measured):
    assert measured["sdpa_allgather_dropped"]["worst"] > 1e6 * RTOL
