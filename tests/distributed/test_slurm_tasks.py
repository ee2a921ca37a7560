"""Two "nodes" of a Slurm job on this machine: two ``forge-run train`` processes started
directly, each with the ``SLURM_*`` variables ``srun`` sets for task i of 2 tasks on 2
nodes (node list ``127.0.0.[1-2]``, both loopback addresses; the rendezvous port derived
from the job id), no torchrun. USR1, the signal ``--signal=USR1@120`` sends before the
time limit, reaches task 0 mid-run: both save one checkpoint at the same step and exit
138 (128 + USR1).

The reference is torchrun across 2 nodes (``forge-run --nproc 1 --nnodes 2 --node-rank
i --rdzv-endpoint``, the multi-node launch of docs/multi-node.md) to that step: the srun
tasks give its losses and gradient norms bit for bit. That a requeued task resumes
exactly is tests/test_slurm.py's (one task, in process: a launch pair costs seconds).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import read_metrics, tiny_config, write_config

from forge_core.cli.slurm import PORT_BASE, PORT_SPAN

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]


def free_port(low: int = PORT_BASE, high: int = PORT_BASE + PORT_SPAN) -> int:
    """A port of the range Forge derives from job ids that nothing listens on now."""
    for port in range(low + os.getpid() % 5000, high):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def srun_env(task: int, job_id: int) -> dict[str, str]:
    """What srun exports for task ``task`` of ``srun --nodes 2 --ntasks-per-node 1``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    nodes = "127.0.0.[1-2]"
    env.update(
        OMP_NUM_THREADS="1",
        SLURM_JOB_ID=str(job_id),
        SLURM_JOBID=str(job_id),
        SLURM_STEP_ID="0",
        SLURM_STEPID="0",
        SLURM_PROCID=str(task),
        SLURM_LOCALID="0",
        SLURM_NODEID=str(task),
        SLURM_NNODES="2",
        SLURM_NTASKS="2",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NUM_NODES="2",
        SLURM_JOB_NODELIST=nodes,
        SLURM_NODELIST=nodes,
        SLURM_STEP_NODELIST=nodes,
        SLURM_TASKS_PER_NODE="1(x2)",
    )
    return env


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "forge_core.cli", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def finish(procs: list[subprocess.Popen], logs: list[Path], timeout: float = 240) -> list[int]:
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for log in logs))
    return codes


def test_srun_tasks_train_like_multi_node_torchrun_and_stop_together_on_usr1(tmp_path):
    # A long run, stopped by USR1 at a step the test does not choose; the learning-rate
    # schedule spans a fixed number of steps, so the reference can stop at any step.
    cfg = tiny_config(
        tmp_path,
        "slurm",
        train={"steps": 100000, "schedule_steps": 40},
        logging={"loggers": ["jsonl"]},
    )
    path = write_config(tmp_path / "slurm.yaml", cfg)
    port = free_port()
    job_id = port - PORT_BASE + 3 * PORT_SPAN  # Forge derives exactly this port from it
    logs = [tmp_path / f"task{i}.log" for i in range(2)]

    tasks = [start(["train", path], srun_env(i, job_id), logs[i]) for i in range(2)]
    metrics = tmp_path / "slurm/metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        if any(t.poll() is not None for t in tasks) or time.monotonic() > deadline:
            finish(tasks, logs, timeout=5)
            pytest.fail("\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for log in logs))
        time.sleep(0.05)
    # Slurm signals every task; task 0 alone is the harder case: task 1 learns of it in
    # the step's all-reduce, stops at the same step and exits with the same status.
    tasks[0].send_signal(signal.SIGUSR1)
    assert finish(tasks, logs) == [138, 138], [log.read_text()[-3000:] for log in logs]
    step = int((tmp_path / "slurm/checkpoints/latest").read_text().strip().removeprefix("step-"))
    ckpt = tmp_path / f"slurm/checkpoints/step-{step:06d}"
    assert sorted(p.name for p in ckpt.glob("train_state-rank*.json")) == [
        "train_state-rank00000.json",
        "train_state-rank00001.json",
    ]
    first = logs[0].read_text()
    assert "device cpu x 2" in first and f"SIGUSR1 received: saving a checkpoint at step {step}" in first

    # The reference: torchrun on 2 nodes of 1 process, to the same step.
    ref = write_config(
        tmp_path / "ref.yaml", {**cfg, "run": {**cfg["run"], "name": "ref", "out_dir": str(tmp_path / "ref")}}
    )
    env = {k: v for k, v in srun_env(0, job_id).items() if not k.startswith("SLURM_")}
    rdzv = f"127.0.0.1:{free_port()}"
    ref_logs = [tmp_path / f"node{i}.log" for i in range(2)]
    nodes = [
        start(
            [
                "train",
                "--nproc",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(i),
                "--rdzv-endpoint",
                rdzv,
                ref,
                f"train.steps={step}",
            ],
            env,
            ref_logs[i],
        )
        for i in range(2)
    ]
    assert finish(nodes, ref_logs) == [0, 0], [log.read_text()[-3000:] for log in ref_logs]

    got, want = read_metrics(tmp_path / "slurm"), read_metrics(tmp_path / "ref")
    assert [m["step"] for m in got] == [m["step"] for m in want] == list(range(1, step + 1))
    for key in ("loss", "grad_norm", "tokens"):
        assert [m[key] for m in got] == [m[key] for m in want], key
