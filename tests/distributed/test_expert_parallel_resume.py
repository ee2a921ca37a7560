"""Elastic resume across expert-parallel degrees through ``forge-run``, in the style of
:mod:`test_elastic_resume`: a checkpoint written under ``parallel.ep: 2`` (each rank
holding half of every MoE block's experts) resumes on 1 process, and one written by 1
process resumes under ``ep: 2``; the steps after the resume give one uninterrupted
process's losses and gradient norms. The checkpoint holds every expert whole under its
unsliced name (the experts are DTensors sharded over ep), so any ep degree re-slices it.

Four ``forge-run`` launches: under ``pytest -m matrix`` (the README's test command
proves the checkpoint's shapes through the scenarios' final parameters instead)."""

from __future__ import annotations

import pytest
from test_elastic_resume import RESUME_AT, STEPS, launch, resume_elsewhere
from test_elastic_resume import config as dense_config
from test_forge_run_parallel import RTOL
from train_helpers import read_metrics

pytestmark = [pytest.mark.distributed, pytest.mark.matrix]

MOE = {"num_experts": 4, "top_k": 2, "expert_hidden": 16, "shared_experts": 1}
LAYOUTS = {"one": (1, {}), "ep2": (2, {"ep": 2})}


def config(tmp, name: str, parallel: dict) -> dict:
    cfg = dense_config(tmp, name, parallel)
    cfg["model"]["options"]["moe"] = MOE
    return cfg


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ep-elastic")
    for name, (nproc, parallel) in LAYOUTS.items():
        launch(tmp, name, nproc, config(tmp, name, parallel))
    return tmp


@pytest.mark.parametrize(
    "source, nproc, parallel", [("ep2", 1, {}), ("one", 2, {"ep": 2})], ids=["ep2-to-1", "1-to-ep2"]
)
def test_resume_on_another_expert_parallel_degree_continues_the_run(
    saved, monkeypatch, source, nproc, parallel
):
    import test_elastic_resume

    monkeypatch.setattr(test_elastic_resume, "config", config)
    straight = read_metrics(saved / "one")
    assert [m["loss"] for m in read_metrics(saved / "ep2")] == pytest.approx(
        [m["loss"] for m in straight], rel=RTOL
    )
    got, err = resume_elsewhere(saved, source, f"{source}-on-{nproc}", nproc, parallel, config)
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    after = [m for m in got if m["step"] > RESUME_AT]
    want = [m for m in straight if m["step"] > RESUME_AT]
    assert len({m["loss"] for m in want}) == len(want)  # the reference really trains
    assert [m["loss"] for m in after] == pytest.approx([m["loss"] for m in want], rel=RTOL)
    assert [m["grad_norm"] for m in after] == pytest.approx([m["grad_norm"] for m in want], rel=RTOL)
    assert "Model and optimizer state are resharded" in " ".join(err.split())
