"""``forge-run CONFIG`` end to end: refusal of invalid configs (also under ``--nproc``),
in process; SIGTERM and SIGKILL in the middle of a checkpoint write (also a background
one, ``checkpoint.async``), to a real process.
The quickstart config's subprocess run is in test_cli_smoke.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO
from train_helpers import Recorder, pause_checkpoint_env, read_metrics, tiny_config, write_config

from forge_core.testing import forge_run

CLI = [sys.executable, "-m", "forge_core.cli"]


def start(args: list[str], tmp_path: Path, env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    """Start forge-run with stdout piped (line by line) and stderr to a file."""
    err = tmp_path / f"stderr-{time.monotonic_ns()}.txt"
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=open(err, "w"),
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    return proc, err


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if needle in line:
            return lines
    proc.kill()
    raise AssertionError(f"never saw {needle!r}; output: {''.join(lines)}")


def test_invalid_config_is_refused_with_the_check_report(tmp_path):
    path = write_config(
        tmp_path / "bad.yaml",
        tiny_config(tmp_path, "bad", data={"seq_len": 128}, train={"batch_size": 3, "grad_accum": 2}),
    )
    result = forge_run([path])
    command = f"forge-run check {path} --world-size 1"  # a single process
    assert f"`{command}` prints the same report" in result.stderr
    check = forge_run([*command.split()[1:]])
    assert check.code == result.code == 2
    report = check.stdout.rsplit("\n", 2)[0]  # everything but check's verdict line
    assert "[model.seq-len]" in report and "[train.batch-divisible]" in report
    assert report in result.stderr
    assert "refusing to train" in result.stderr
    assert not (tmp_path / "bad").exists()


def test_nproc_is_judged_before_any_process_starts(tmp_path):
    """--nproc 2 with every degree 1: the world-size rule refuses it at once."""
    path = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, parallel={"dp_shard": 1}))
    result = forge_run(["--nproc", "2", path])
    assert result.code == 2
    assert "[parallel.world-size]" in result.stderr and "world size is 2" in result.stderr
    assert f"`forge-run check {path} --world-size 2` prints the same report" in result.stderr


def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path):
    cfg = tiny_config(tmp_path, "term", train={"steps": 100000}, logging={"loggers": ["jsonl"]})
    proc, err = start([write_config(tmp_path / "term.yaml", cfg)], tmp_path)
    metrics = tmp_path / "term/metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, err.read_text()  # 128 + SIGTERM: stopped, not completed
    latest = (tmp_path / "term/checkpoints/latest").read_text().strip()
    step = int(latest.removeprefix("step-"))
    assert step >= 3 and f"SIGTERM received: saving a checkpoint at step {step}" in out
    assert [r["step"] for r in read_metrics(tmp_path / "term")][-1] == step


def resumes_from_step_2_as_if_never_killed(tmp_path: Path, path: str, root: Path) -> None:
    """The run killed during the save of step 4 resumes from step 2, removes what the
    save left, and ends as the run that was never killed, loss for loss."""
    from forge_core.testing import train_in_process

    result = forge_run([path])
    assert result.code == 0, result.stderr
    assert f"resumed from {root / 'step-000002'} at step 2" in result.stdout
    assert (root / "latest").read_text().strip() == "step-000006"
    assert not (root / ".tmp-step-000004").exists()
    rec = Recorder()
    straight = tiny_config(tmp_path, "straight", train={"steps": 6})
    train_in_process(write_config(tmp_path / "straight.yaml", straight), extra_plugins=(("rec", rec),))
    assert [r["loss"] for r in read_metrics(tmp_path / "crash")] == [
        rec.metrics[s]["loss"] for s in range(1, 7)
    ]


def test_sigkill_during_a_checkpoint_write_resumes_from_the_previous_one(tmp_path):
    cfg = tiny_config(
        tmp_path,
        "crash",
        train={"steps": 6},
        checkpoint={"every": 2, "keep": 3},
        logging={"loggers": ["jsonl"]},
    )
    path = write_config(tmp_path / "crash.yaml", cfg)
    proc, err = start([path], tmp_path, env=pause_checkpoint_env(tmp_path, 4))
    wait_for_line(proc, "checkpoint write in progress at step 4")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    root = tmp_path / "crash/checkpoints"
    assert (root / "latest").read_text().strip() == "step-000002"
    assert (root / ".tmp-step-000004").is_dir() and not (root / "step-000004").exists()

    resumes_from_step_2_as_if_never_killed(tmp_path, path, root)


def test_sigkill_while_a_background_save_is_in_flight_resumes_from_the_previous_one(tmp_path):
    """``checkpoint.async``: killed while training runs on with the save of step 4 half
    done (its files there, no manifest): that save is never picked, the one of step 2
    resumes, and the run ends as the one never killed, bit for bit."""
    cfg = tiny_config(
        tmp_path,
        "crash",
        train={"steps": 6},
        checkpoint={"every": 2, "keep": 3, "async": True},
        logging={"loggers": ["jsonl"]},
    )
    path = write_config(tmp_path / "crash.yaml", cfg)
    proc, err = start([path], tmp_path, env=pause_checkpoint_env(tmp_path, 4, background=True))
    # Either comes first: the background thread reaches the manifest while steps train.
    seen = wait_for_line(proc, "background checkpoint write in flight at step 4")
    if not any("step 5 trained" in line for line in seen):
        wait_for_line(proc, "step 5 trained")  # a step trained while the save is in flight
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    root = tmp_path / "crash/checkpoints"
    assert (root / "latest").read_text().strip() == "step-000002"
    assert (root / ".tmp-step-000004/.metadata").is_file() and not (root / "step-000004").exists()

    resumes_from_step_2_as_if_never_killed(tmp_path, path, root)
