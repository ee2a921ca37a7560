"""The routing statistics of an MoE llama through ``forge-run --nproc 2`` with two
pipeline stages equal one process's: each stage reports its own MoE block, rank 0 logs
both (the layout agreed between the stages, the numbers summed in the step's
all-reduce), and what torch's shape inference ran through each stage at the first step
is not counted. The console line of rank 0 shows them; MFU counts the active
parameters. The sums over data-parallel ranks and not over tensor-parallel copies are
proved in tests/test_model_stats.py (every figure the MoE layer reports is a ratio,
which copies counted twice would leave as it is)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from train_helpers import read_metrics, tiny_config, write_config

from forge_core.cli.train import train

pytestmark = pytest.mark.distributed

MOE = {
    "num_experts": 4,
    "top_k": 2,
    "expert_hidden": 16,
    "capacity_factor": 1.0,  # drops some assignments: dropped_frac is compared too
    "aux_loss": 0.01,
    "z_loss": 0.001,
}


LAYOUT = {"pp": 2, "options": {"pp": {"microbatches": 2}}}


def config(tmp_path, name, grad_accum, **parallel):
    cfg = tiny_config(
        tmp_path,
        name=name,
        parallel=parallel,
        train={"steps": 1, "batch_size": 8, "grad_accum": grad_accum},
        logging={"loggers": ["console", "jsonl"], "options": {"console": {"bar": False}}},
    )
    cfg["model"]["options"]["moe"] = MOE
    return write_config(tmp_path / f"{name}.yaml", cfg)


def test_moe_statistics_of_two_pipeline_stages_equal_one_process(tmp_path):
    # The same rows in each forward: 8 / 4 micro-batches in one process; 8 / 2 micro-batches
    # / 2 pipeline microbatches on the stages.
    assert train(config(tmp_path, "one", 4), []) == "completed"
    (one,) = read_metrics(tmp_path / "one")
    command = ["train", "--nproc", "2", config(tmp_path, "pp", 2, **LAYOUT)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "forge_core.cli", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    (got,) = read_metrics(tmp_path / "pp")
    keys = sorted(k for k in one if k.startswith("moe/"))
    assert {"moe/layers.0/load_cv", "moe/layers.1/aux_loss", "moe/max/dropped_frac"} <= set(keys)
    assert one["moe/aux_loss"] > 0 and one["moe/max/dropped_frac"] > 0
    # Before the stages dropped what shape inference's forward counted, layer 0 counted
    # microbatch 0 twice (more drops) and layer 1 uninitialised memory (a NaN aux_loss).
    assert {k: got[k] for k in keys} == pytest.approx({k: one[k] for k in keys}, rel=1e-5)
    assert f"moe aux {got['moe/aux_loss']:.4g} cv {got['moe/max/load_cv']:.2f}" in proc.stderr
    assert "active per token: MFU counts these" in proc.stdout
