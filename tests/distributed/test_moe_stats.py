"""The routing statistics of an MoE llama through ``forge-run --nproc 4`` (two pipeline
stages x two data-parallel FSDP ranks) equal one process's on the first step: each
stage reports its own MoE block (the layout agreed between the stages) and drops what
shape inference's extra forward counted, and the sums over the data-parallel ranks,
which routed different rows, give the global batch's loads and drops (one rank's rows
alone give other loads). The console line of rank 0 shows them; MFU counts the active
parameters. That tensor-parallel copies are not summed is proved in
tests/test_model_stats.py (every figure the MoE layer reports is a ratio, which copies
counted twice would leave as it is)."""

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


LAYOUT = {"pp": 2, "dp_shard": 2, "options": {"pp": {"microbatches": 2}}}


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


def test_moe_statistics_over_pipeline_stages_and_data_parallel_ranks_equal_one_process(tmp_path):
    # The same rows per forward: 8 / 4 in one process; 8 / (2 data-parallel x 2 accumulated
    # x 2 pipeline microbatches) per process, summed over the two data-parallel ranks.
    assert train(config(tmp_path, "one", 4), []) == "completed"
    (one,) = read_metrics(tmp_path / "one")
    command = ["train", "--nproc", "4", config(tmp_path, "pp_dp", 2, **LAYOUT)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "forge_core.cli", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    (got,) = read_metrics(tmp_path / "pp_dp")
    # The balancing loss is taken over the tokens of one forward, and which rows share a
    # forward differs between the layouts: every other figure is the global batch's.
    keys = sorted(k for k in one if k.startswith("moe/") and not k.endswith("/aux_loss"))
    assert {"moe/layers.0/load_cv", "moe/layers.1/load_cv", "moe/max/dropped_frac"} <= set(keys)
    assert one["moe/max/dropped_frac"] > 0 and got["moe/layers.1/aux_loss"] > 0
    # Before the stages dropped what shape inference's forward counted: layer 0 counted
    # microbatch 0 twice (dropped_frac 0.127 for 0.082) and layer 1 uninitialised memory (NaN).
    assert {k: got[k] for k in keys} == pytest.approx({k: one[k] for k in keys}, rel=1e-6)
    assert f"moe aux {got['moe/aux_loss']:.4g} cv {got['moe/max/load_cv']:.2f}" in proc.stderr
    assert "active per token: MFU counts these" in proc.stdout
