"""End to end through ``forge-run --nproc 2``: the real trainer, loader and loggers on 2
CPU processes give the per-step losses and gradient norms of one process, on rows packed
with isolated documents (the loader's doc_ids and positions reach every pipeline
stage); combinations the pipeline rules refuse stop before torchrun is even started. The
runs hold out documents and evaluate every 2 steps: the eval numbers under FSDP and
pipeline parallelism are those of one process. The runs are the session's
(:mod:`forge_runs`), which :mod:`test_elastic_resume` also resumes on other layouts.

Tolerance as in :mod:`test_parallel_equivalence` (fp32, reduction order only): 1e-5
relative, against losses and norms that ``metrics.jsonl`` records to full precision.
"""

from __future__ import annotations

import subprocess

import pytest
from forge_runs import EVAL_EVERY, RTOL, STEPS, saved_runs
from train_helpers import read_metrics, tiny_config, write_config

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    saved = saved_runs(tmp_path_factory)  # the runs test_elastic_resume resumes
    return {name: read_metrics(saved / name) for name in ("one", "fsdp", "pp")}


@pytest.mark.parametrize("name", ["fsdp", "pp"])
def test_forge_run_two_processes_equals_one(runs, name):
    one, got = runs["one"], runs[name]
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    assert [m["loss"] for m in got] == pytest.approx([m["loss"] for m in one], rel=RTOL)
    assert [m["grad_norm"] for m in got] == pytest.approx([m["grad_norm"] for m in one], rel=RTOL)
    assert [m["tokens"] for m in got] == [m["tokens"] for m in one]


@pytest.mark.parametrize("name", ["fsdp", "pp"])
def test_forge_run_two_processes_evaluate_like_one(runs, name):
    one, got = runs["one"], runs[name]

    def evals(records, key):
        return {m["step"]: m[key] for m in records if key in m}

    # every EVAL_EVERY steps, and at the end (eval.at_end)
    every = [step for step in range(1, STEPS + 1) if step % EVAL_EVERY == 0 or step == STEPS]
    assert sorted(evals(one, "eval/loss")) == every and evals(one, "eval/tokens")[2] > 0
    assert evals(got, "eval/tokens") == evals(one, "eval/tokens")
    for key in ("eval/loss", "eval/perplexity"):
        assert evals(got, key) == pytest.approx(evals(one, key), rel=RTOL)


ZBV = {"schedule": "zbv_zero_bubble", "virtual_stages": 2}


@pytest.mark.parametrize(
    ("rule", "parallel", "train", "says"),
    [
        (
            "pp.split-backward-not-with-compile",
            {"pp": 2, "options": {"pp": ZBV}},
            {"compile": True},
            "donated buffers",
        ),
        (
            "pp.split-backward-fsdp-reshard",
            {"pp": 2, "dp_shard": 2, "options": {"pp": ZBV}},
            {"batch_size": 8},
            "reshard_after_forward: true",
        ),
        (
            "pp.schedule-virtual-stages",
            {"pp": 2, "options": {"pp": {"schedule": "dualpipev"}}},
            {},
            "exactly two stages on every rank",
        ),
        (
            "pp.microbatches",
            {"pp": 2, "options": {"pp": {"schedule": "dualpipev", "virtual_stages": 2, "microbatches": 2}}},
            {},
            "at least one microbatch per stage",
        ),
    ],
)
def test_refused_pipeline_combinations_stop_before_torchrun(
    tmp_path, monkeypatch, capsys, rule, parallel, train, says
):
    """The rule's report, exit 2, and neither a torchrun child nor a process group nor
    a run directory."""
    import torch.distributed as dist

    from forge_core import cli

    cfg = tiny_config(tmp_path, name="refused", parallel=parallel)
    cfg["train"].update(train)
    path = write_config(tmp_path / "refused.yaml", cfg)

    def no_child(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    world = parallel["pp"] * parallel.get("dp_shard", 1)
    rc = cli.main(["train", "--nproc", str(world), path])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"[{rule}]" in err and says in err, err
    assert not dist.is_initialized()
    assert not (tmp_path / "refused").exists()
