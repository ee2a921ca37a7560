"""End to end through ``forge-run --nproc 2``: the real trainer, loader and loggers on 2
CPU processes give the per-step losses and gradient norms of one process, on rows packed
with isolated documents (the loader's doc_ids and positions reach every pipeline
stage); combinations the pipeline rules refuse stop before torchrun is even started. The
runs hold out documents and evaluate every 2 steps: the eval numbers under FSDP and
pipeline parallelism are those of one process.

Tolerance as in :mod:`test_parallel_equivalence` (fp32, reduction order only): 1e-5
relative, against losses and norms that ``metrics.jsonl`` records to full precision.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import read_metrics, tiny_config, write_config

pytestmark = pytest.mark.distributed

RTOL = 1e-5


def forge_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "forge_core.cli", *args], capture_output=True, text=True, env=env, timeout=240
    )


def config(tmp_path: Path, name: str, **parallel) -> str:
    # concat isolates documents by default: doc_ids and positions go with every batch.
    cfg = tiny_config(tmp_path, name=name, parallel=parallel, logging={"loggers": ["jsonl"]})
    cfg["train"]["steps"] = 4
    cfg["data"]["heldout"] = {"fraction": 0.3}
    cfg["eval"] = {"enabled": True, "every": 2}
    return write_config(tmp_path / f"{name}.yaml", cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forge_run")
    out = {}
    for name, nproc, parallel in (
        ("one", 1, {}),
        ("fsdp", 2, {"dp_shard": 2}),
        ("pp", 2, {"pp": 2, "options": {"pp": {"microbatches": 2}}}),
    ):
        proc = forge_run("train", "--nproc", str(nproc), config(tmp, name, **parallel))
        assert proc.returncode == 0, f"{name}: {proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        out[name] = read_metrics(tmp / name)
    return out


@pytest.mark.parametrize("name", ["fsdp", "pp"])
def test_forge_run_two_processes_equals_one(runs, name):
    one, got = runs["one"], runs[name]
    assert [m["step"] for m in got] == [1, 2, 3, 4]
    assert [m["loss"] for m in got] == pytest.approx([m["loss"] for m in one], rel=RTOL)
    assert [m["grad_norm"] for m in got] == pytest.approx([m["grad_norm"] for m in one], rel=RTOL)
    assert [m["tokens"] for m in got] == [m["tokens"] for m in one]


@pytest.mark.parametrize("name", ["fsdp", "pp"])
def test_forge_run_two_processes_evaluate_like_one(runs, name):
    one, got = runs["one"], runs[name]

    def evals(records, key):
        return {m["step"]: m[key] for m in records if key in m}

    assert sorted(evals(one, "eval/loss")) == [2, 4] and evals(one, "eval/tokens")[2] > 0
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
