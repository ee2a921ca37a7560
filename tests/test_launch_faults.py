"""How ``forge-run`` ends when things go wrong around the training loop, in subprocesses:
SIGTERM during start-up, a worker that stops answering (SIGSTOP), a worker killed,
``forge-run`` or its torchrun agent killed with SIGKILL. Each ends within bounded time,
with one clean message, an exit status that says what happened, and no process left
behind. (Times are bounded by the test's timeouts, never asserted.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, make_distribution
from train_helpers import read_metrics, tiny_config, write_config

from forge_core.train.signals import alive, child_pids

CLI = [sys.executable, "-m", "forge_core.cli"]

SLOW_SOURCE = """
import os, time

from forge_core.api import SourceSpec, hookimpl


class SlowSource:
    \"\"\"Announces that the build reached it, then takes its time.\"\"\"

    def __init__(self, options):
        pass

    def describe(self):
        return "slow test source"

    def documents(self):
        marker = os.path.join(os.environ["FORGE_TEST_MARKERS"], "building-" + os.environ.get("RANK", "0"))
        open(marker, "w").close()
        time.sleep(300)
        yield "never reached"


@hookimpl
def forge_sources():
    return [SourceSpec(name="slow", summary="Sleeps while building", impl="forge_slow:SlowSource")]
"""


def start(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=open(out, "w"),
        stderr=open(err, "w"),
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    return proc, out, err


def wait_until(condition, proc: subprocess.Popen, err: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"forge-run ended early ({proc.returncode}): {err.read_text()}"
        assert time.monotonic() < deadline, f"timed out; stderr: {err.read_text()}"
        time.sleep(0.1)


def steps_logged(run_dir: Path, n: int):
    path = run_dir / "metrics.jsonl"
    return lambda: path.is_file() and len(path.read_text().splitlines()) >= n


def wait_gone(pids, timeout: float = 90) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def rank_of(pid: int) -> int:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return int(env[b"RANK"])


def agent_and_workers(proc: subprocess.Popen, err: Path) -> tuple[int, dict[int, int]]:
    """The agent's pid and its workers' pids by rank, once both workers run."""
    found: dict[int, int] = {}

    def both() -> bool:
        for agent in child_pids(proc.pid):
            found.clear()
            found.update({rank_of(pid): pid for pid in child_pids(agent)})
            found[-1] = agent
        return len(found) == 3

    wait_until(both, proc, err)
    agent = found.pop(-1)
    return agent, found


def two_process_run(tmp_path: Path, name: str, *overrides: str):
    cfg = tiny_config(tmp_path, name, train={"steps": 1_000_000}, logging={"loggers": ["jsonl"]})
    proc, out, err = start(tmp_path, write_config(tmp_path / f"{name}.yaml", cfg), "--nproc", "2", *overrides)
    wait_until(steps_logged(tmp_path / name, 3), proc, err)
    agent, workers = agent_and_workers(proc, err)
    return proc, out, err, agent, workers


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.distributed)])
def test_sigterm_during_start_up_stops_cleanly(tmp_path, nproc):
    """SIGTERM while the data is being built (before the training loop exists): one
    notice, status 143, nothing written as a checkpoint, no traceback."""
    site = make_distribution(
        tmp_path / "site", "forge-slow", "0.1", {"forge_slow": SLOW_SOURCE}, {"slow": "forge_slow"}
    )
    markers = tmp_path / "markers"
    markers.mkdir()
    cfg = tiny_config(tmp_path, "slow", data={"source": "slow", "source_options": {}})
    env = {
        "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "FORGE_TEST_MARKERS": str(markers),
    }
    proc, out, err = start(
        tmp_path, write_config(tmp_path / "slow.yaml", cfg), "--nproc", str(nproc), env=env
    )
    wait_until(lambda: len(list(markers.iterdir())) == nproc, proc, err)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, err.read_text()
    stderr = err.read_text()
    assert (
        stderr.count(
            "SIGTERM received during start-up: stopped before training; nothing was trained or saved"
        )
        == 1
    ), stderr
    assert "Traceback" not in stderr
    assert not (tmp_path / "slow" / "checkpoints").exists()


@pytest.mark.distributed
def test_a_worker_that_stops_answering_ends_the_job_naming_it(tmp_path):
    """SIGSTOP on rank 1 of `--nproc 2`: rank 0's next collective times out after
    run.collective_timeout, and the job ends (status 124) naming the stopped rank."""
    proc, out, err, agent, workers = two_process_run(tmp_path, "hang", "run.collective_timeout=3")
    os.kill(workers[1], signal.SIGSTOP)
    try:
        code = proc.wait(timeout=150)
    finally:
        if alive(workers[1]):
            os.kill(workers[1], signal.SIGCONT)
    stderr = err.read_text()
    assert code == 124, stderr
    assert (
        "rank 0: a collective got no answer within run.collective_timeout = 3 s: rank 1 stopped answering"
        in stderr
    )
    assert f"rank 1 (pid {workers[1]}) had been stopped (SIGSTOP, or a debugger)" in stderr
    assert "Traceback" not in stderr and "ChildFailedError" not in stderr
    assert wait_gone([agent, *workers.values()]) == []


@pytest.mark.distributed
def test_a_killed_worker_ends_the_job_with_128_plus_its_signal(tmp_path):
    proc, out, err, agent, workers = two_process_run(tmp_path, "killed")
    os.kill(workers[1], signal.SIGKILL)
    assert proc.wait(timeout=120) == 137, err.read_text()
    stderr = err.read_text()
    assert f"rank 1 (pid {workers[1]}) was killed by SIGKILL" in stderr and "Traceback" not in stderr
    assert wait_gone([agent, *workers.values()]) == []


@pytest.mark.distributed
def test_kill_9_of_forge_run_stops_its_workers(tmp_path):
    """The kernel tells the agent that forge-run died; the agent stops its workers, which
    save a checkpoint at the next step boundary first."""
    proc, out, err, agent, workers = two_process_run(tmp_path, "orphan")
    proc.kill()
    proc.wait(timeout=30)
    assert wait_gone([agent, *workers.values()]) == [], "workers left training"
    step = int((tmp_path / "orphan/checkpoints/latest").read_text().strip().removeprefix("step-"))
    assert step >= 3 and read_metrics(tmp_path / "orphan")[-1]["step"] == step


@pytest.mark.distributed
def test_kill_9_of_the_agent_stops_its_workers_and_forge_run_says_so(tmp_path):
    proc, out, err, agent, workers = two_process_run(tmp_path, "noagent")
    os.kill(agent, signal.SIGKILL)
    assert proc.wait(timeout=120) == 137, err.read_text()
    assert f"the torchrun agent (pid {agent}) was killed by SIGKILL" in err.read_text()
    assert wait_gone(workers.values()) == []
    assert (tmp_path / "noagent/checkpoints/latest").is_file()


def test_the_agents_report_prints_each_message_once_and_picks_the_status(tmp_path, capsys):
    """Unit test of the report on torch's failure records: one message shared by every
    rank is printed once; different ones carry their ranks; a signal death is named; the
    status follows docs/cli.md (2 before 124 before 128 + N before 1)."""
    import json
    from types import SimpleNamespace

    from forge_core.cli.agent import WorkerWatch, report

    def failure(rank, code, message=None):
        path = tmp_path / f"error-{rank}-{code}.json"
        data = {"message": "<NONE>"}
        if message is not None:
            data = {"message": message, "timestamp": 0}
            path.write_text(json.dumps(data))
        return SimpleNamespace(pid=1000 + rank, exitcode=code, error_file=str(path), error_file_data=data)

    watch = WorkerWatch()
    bad = "error: building tokenizer 'hf' (plugin 'tokenizers') failed: OSError: no such file"
    assert report({0: failure(0, 2, bad), 1: failure(1, 2, bad)}, watch) == 2
    assert capsys.readouterr().err == bad + "\n"
    assert report({0: failure(0, 1, "error: rank 0: lost the connection"), 1: failure(1, -9)}, watch) == 137
    err = capsys.readouterr().err
    assert "error: rank 0: lost the connection" in err and "rank 1 (pid 1001) was killed by SIGKILL" in err
    assert report({0: failure(0, 1, "error: a"), 1: failure(1, 1, "error: b")}, watch) == 1
    assert capsys.readouterr().err == "[rank 0] error: a\n[rank 1] error: b\n"
    watch.stopped_since[1001] = time.time()
    assert (
        report({0: failure(0, 124, "error: rank 0: a collective got no answer"), 1: failure(1, -9)}, watch)
        == 124
    )
    err = capsys.readouterr().err
    assert "rank 1 (pid 1001) had been stopped" in err and "killed" not in err
    assert (
        report(
            {0: failure(0, 143, "forge: SIGTERM received during start-up"), 1: failure(1, -15)}, WorkerWatch()
        )
        == 143
    )
