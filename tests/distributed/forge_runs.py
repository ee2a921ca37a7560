"""The ``forge-run`` runs that :mod:`test_elastic_resume` resumes elsewhere and
:mod:`test_forge_run_parallel` compares with one process: one process and four 2-process
layouts (FSDP, tensor, pipeline, context parallel), trained ONCE per test session.

Both modules need the same thing, the real trainer under each layout giving one
process's numbers, so they read the same runs instead of launching their own (each
2-process launch imports torch three times). The config serves both: packed rows with
isolated documents (the loader's ``doc_ids`` and ``positions`` reach every pipeline
stage and context-parallel shard), documents held out and evaluated every 2 steps, and
checkpoints every 2 steps (in the background under FSDP, ``checkpoint.async``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import torch_threads
from train_helpers import tiny_config, write_config

from forge_core.testing import CliResult
from forge_core.testing import forge_run as in_process

#: fp32, reduction order only (see :mod:`test_parallel_equivalence`).
RTOL = 1e-5
STEPS, RESUME_AT = 5, 2
EVAL_EVERY = 2
LAYOUTS = {
    "one": (1, {}),
    "fsdp": (2, {"dp_shard": 2}),
    "tp": (2, {"tp": 2}),
    "pp": (2, {"pp": 2, "options": {"pp": {"microbatches": 2}}}),
    "cp": (2, {"cp": 2}),  # each row's tokens split over 2 ranks; FSDP shards over them
}


def forge_run(*args: str) -> subprocess.CompletedProcess:
    """``forge-run ARGS`` in a subprocess, one thread per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "forge_core.cli", *args], capture_output=True, text=True, env=env, timeout=240
    )


def config(tmp: Path, name: str, parallel: dict) -> dict:
    # concat isolates documents by default: doc_ids and positions go with every batch.
    cfg = tiny_config(tmp, name=name, parallel=parallel, logging={"loggers": ["jsonl"]})
    cfg["train"]["steps"] = STEPS
    cfg["data"]["heldout"] = {"fraction": 0.3}
    cfg["eval"] = {"enabled": True, "every": EVAL_EVERY}
    cfg["checkpoint"] = {"every": RESUME_AT, "keep": 5, "async": "dp_shard" in parallel}
    return cfg


def launch(tmp: Path, name: str, nproc: int, cfg: dict) -> CliResult:
    """``forge-run train --nproc N`` on ``cfg``. One process trains in this one: the
    process boundary is not what these tests are about (the layouts are), and a
    subprocess would import torch again for each one-process run."""
    path = write_config(tmp / f"{name}.yaml", cfg)
    if nproc == 1:
        with torch_threads(1):  # as the subprocesses run (OMP_NUM_THREADS=1)
            proc = in_process(["train", path])
    else:
        done = forge_run("train", "--nproc", str(nproc), path)
        proc = CliResult(done.returncode, done.stdout, done.stderr)
    assert proc.code == 0, f"{name}: {proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


_saved: list[Path] = []  # the session's runs, once trained


def saved_runs(tmp_path_factory) -> Path:
    """The directory holding a run directory per :data:`LAYOUTS` name, trained on the
    first call of the session."""
    if not _saved:
        tmp = tmp_path_factory.mktemp("forge-runs")
        for name, (nproc, parallel) in LAYOUTS.items():
            launch(tmp, name, nproc, config(tmp, name, parallel))
        _saved.append(tmp)
    return _saved[0]
