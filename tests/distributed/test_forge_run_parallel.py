"""End to end through ``forge-run --nproc 2``: the real trainer, loader and loggers on 2
CPU processes give the per-step losses and gradient norms of one process; pipeline
parallelism trains with a packer that does not isolate documents, and is refused with
one that does before torchrun is even started. The runs hold out documents and evaluate
every 2 steps (all but the pipeline run, whose forward-only step is not built yet): the
eval numbers under FSDP are those of one process.

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
    return subprocess.run([sys.executable, "-m", "forge_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=240)


def config(tmp_path: Path, name: str, **parallel) -> str:
    # concat without isolation: the one data layout every strategy (pp included) accepts.
    cfg = tiny_config(tmp_path, name=name, parallel=parallel, logging={"loggers": ["jsonl"]})
    cfg["data"]["packer_options"] = {"isolate": False}
    cfg["train"]["steps"] = 4
    cfg["data"]["heldout"] = {"fraction": 0.3}
    cfg["eval"] = {"enabled": "pp" not in parallel, "every": 2}
    return write_config(tmp_path / f"{name}.yaml", cfg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forge_run")
    out = {}
    for name, nproc, parallel in (("one", 1, {}), ("fsdp", 2, {"dp_shard": 2}),
                                  ("pp", 2, {"pp": 2, "options": {"pp": {"microbatches": 2}}})):
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


def test_forge_run_two_processes_evaluate_like_one(runs):
    one, got = runs["one"], runs["fsdp"]
    def evals(records, key):
        return {m["step"]: m[key] for m in records if key in m}

    assert sorted(evals(one, "eval/loss")) == [2, 4] and evals(one, "eval/tokens")[2] > 0
    assert evals(got, "eval/tokens") == evals(one, "eval/tokens")
    for key in ("eval/loss", "eval/perplexity"):
        assert evals(got, key) == pytest.approx(evals(one, key), rel=RTOL)


def test_pp_with_isolating_packer_is_refused_before_torchrun(tmp_path, monkeypatch, capsys):
    """The founding rule's report, exit 2, and neither a torchrun child nor a process
    group nor a run directory."""
    import torch.distributed as dist

    from forge_core import cli

    cfg = tiny_config(tmp_path, name="refused", parallel={"pp": 2})  # concat isolates by default
    path = write_config(tmp_path / "refused.yaml", cfg)

    def no_child(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", no_child)
    rc = cli.main(["train", "--nproc", "2", path])
    err = capsys.readouterr().err
    assert rc == 2
    assert "[parallel.metadata-reaches-layers]" in err and "$.parallel.pp = 2" in err
    assert "previous stage's hidden states" in err  # the pp spec's reason, quoted by the rule
    assert not dist.is_initialized()
    assert not (tmp_path / "refused").exists()
