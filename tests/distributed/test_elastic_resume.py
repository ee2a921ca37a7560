"""Elastic resume through ``forge-run``: a checkpoint written by 2 processes (FSDP, tensor,
pipeline or context parallel) resumes on 1, and one written by 1 resumes on 2 (FSDP, cp);
the steps after the resume give the losses and gradient norms of one uninterrupted
process, with a warning for what cannot carry over (the per-process random streams).
The FSDP layouts save in the background (``checkpoint.async``): two processes write
their shards from threads of their own while training on, and the checkpoints resume.

Tolerance as in :mod:`test_parallel_equivalence`: 1e-5 relative (fp32, reduction order
only; measured at most 9e-8). A checkpoint whose model or optimizer state did not load
would move the losses after the resume by far more: the model would be back at its
initialisation (a loss of about 5.6 instead of 5.4) or Adam's moments lost.

The runs resumed are the session's (:mod:`forge_runs`), which
:mod:`test_forge_run_parallel` compares with one process too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from forge_runs import LAYOUTS, RESUME_AT, RTOL, STEPS, config, launch, saved_runs
from train_helpers import read_metrics

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return saved_runs(tmp_path_factory)


def resume_elsewhere(
    tmp: Path, source: str, name: str, nproc: int, parallel: dict, make_config=config
) -> tuple[list, str]:
    """A copy of ``source``'s run directory as it was after step RESUME_AT, resumed on
    ``nproc`` processes with layout ``parallel`` (the config from ``make_config``)."""
    shutil.copytree(tmp / source, tmp / name)
    checkpoints = tmp / name / "checkpoints"
    for ckpt in checkpoints.glob("step-*"):
        if int(ckpt.name.split("-")[1]) > RESUME_AT:
            shutil.rmtree(ckpt)
    (checkpoints / "latest").write_text(f"step-{RESUME_AT:06d}\n")
    assert yaml.safe_load((tmp / name / "config.yaml").read_text())["run"]["out_dir"] == str(tmp / source)
    proc = launch(tmp, name, nproc, make_config(tmp, name, parallel))
    return read_metrics(tmp / name), proc.stderr


@pytest.mark.parametrize(
    "source, nproc, parallel",
    [
        ("fsdp", 1, {}),  # 2 -> 1: the data-parallel degree shrinks
        ("tp", 1, {}),  # 2 -> 1: tensor-parallel shards merged
        ("pp", 1, {}),  # 2 -> 1: pipeline stages merged
        ("cp", 1, {}),  # 2 -> 1: context-parallel shards merged
        ("one", 2, {"dp_shard": 2}),  # 1 -> 2
        ("one", 2, {"cp": 2}),  # 1 -> 2 context-parallel ranks
    ],
    ids=["fsdp2-to-1", "tp2-to-1", "pp2-to-1", "cp2-to-1", "1-to-fsdp2", "1-to-cp2"],
)
def test_resume_on_another_number_of_processes_continues_the_run(saved, source, nproc, parallel):
    straight = read_metrics(saved / "one")
    written_by = LAYOUTS[source][0]
    layout = "-".join(f"{k}{v}" for k, v in parallel.items() if k != "options") or "plain"
    got, err = resume_elsewhere(saved, source, f"{source}-on-{nproc}-{layout}", nproc, parallel)
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))  # the jsonl kept the steps before
    after = [m for m in got if m["step"] > RESUME_AT]
    want = [m for m in straight if m["step"] > RESUME_AT]
    assert [m["loss"] for m in after] == pytest.approx([m["loss"] for m in want], rel=RTOL)
    assert [m["grad_norm"] for m in after] == pytest.approx([m["grad_norm"] for m in want], rel=RTOL)
    assert [m["tokens"] for m in after] == [m["tokens"] for m in want]  # the same batches
    text = " ".join(err.split())
    assert (
        f"was written by {written_by} process{'es' * (written_by > 1)}; resuming on {nproc}. Model and "
        f"optimizer state are resharded"
    ) in text
    assert "Random number streams are per process and cannot carry over" in text


def test_the_source_runs_equal_one_process(saved):
    # Guards the comparison above: every saved layout trained like one process too, and
    # the reference really trains (the losses after the resume point all differ).
    straight = read_metrics(saved / "one")
    assert len({m["loss"] for m in straight}) == STEPS
    for name in ("fsdp", "tp", "pp", "cp"):
        assert [m["loss"] for m in read_metrics(saved / name)] == pytest.approx(
            [m["loss"] for m in straight], rel=RTOL
        ), name
    assert all(m["mem_rss_peak_gib_max"] >= m["mem_rss_peak_gib"] > 0 for m in read_metrics(saved / "fsdp"))
