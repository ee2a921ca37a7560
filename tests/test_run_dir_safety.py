"""The run directory under stress: one run per ``run.out_dir`` (a second one is refused
naming the holder; a lock left by a dead process is taken over), an out_dir that is a
file or cannot be written, a full disk at start and during a save, leftovers of
interrupted writes, and a metrics file that is appended to, never replaced."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import run_cli
from test_train_cli import start, wait_for_line
from train_helpers import pause_checkpoint_env, read_metrics, tiny_config, write_config

from forge_core import cli
from forge_core.api import ForgeError
from forge_core.train import rundir
from forge_core.train.run_lock import LOCK, RunLock, _process_start


def config_file(tmp_path, name="run", **sections):
    return write_config(tmp_path / f"{name}.yaml", tiny_config(tmp_path, name, **sections))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# --- one run per directory ----------------------------------------------------------


def test_a_second_run_on_a_locked_directory_is_refused_naming_the_holder(tmp_path, capsys):
    path = config_file(tmp_path, train={"steps": 2})
    lock = RunLock.acquire(tmp_path / "run")
    try:
        assert cli.main([path]) == 2
        err = capsys.readouterr().err
        assert f"is in use by another run: pid {os.getpid()} on host {socket.gethostname()}, started " in err
        assert "$.run.out_dir" in err and "Traceback" not in err
        assert not (tmp_path / "run/config.yaml").exists() and not (tmp_path / "run/checkpoints").exists()
    finally:
        lock.release()
    assert cli.main([path]) == 0
    assert not (tmp_path / "run" / LOCK).exists()  # released at the end


def test_a_lock_is_exclusive_within_one_process_too(tmp_path):
    lock = RunLock.acquire(tmp_path)
    with pytest.raises(ForgeError, match=f"pid {os.getpid()}"):
        RunLock.acquire(tmp_path)
    lock.release()
    RunLock.acquire(tmp_path).release()


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(tmp_path, capsys):
    path = config_file(tmp_path, train={"steps": 2})
    (tmp_path / "run").mkdir()
    pid = dead_pid()
    (tmp_path / "run" / LOCK).write_text(
        json.dumps({"pid": pid, "host": socket.gethostname(), "started": "2020-01-01T00:00:00+00:00"})
    )
    assert cli.main([path]) == 0
    err = capsys.readouterr().err
    assert f"taking over the lock {tmp_path / 'run' / LOCK} left by pid {pid}" in err
    assert "no longer running" in err


def test_a_recorded_live_holder_is_respected_without_flock(tmp_path):
    """Where flock does nothing (some network file systems), the recorded holder, alive
    on this host with the same process start time, still keeps a second run out."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK).write_text(
            json.dumps(
                {
                    "pid": holder.pid,
                    "host": socket.gethostname(),
                    "proc_start": _process_start(holder.pid),
                    "started": "x",
                }
            )
        )
        with pytest.raises(ForgeError, match=f"in use by another run: pid {holder.pid}"):
            RunLock.acquire(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    RunLock.acquire(tmp_path).release()  # now dead: taken over


def test_two_real_runs_on_one_directory(tmp_path):
    """Run A pauses inside a checkpoint write; run B on the same out_dir is refused at
    once naming A's pid; A is killed; run C takes over A's stale lock, removes A's
    half-written checkpoint and trains. The metrics file describes one run."""
    path = config_file(
        tmp_path, "shared", train={"steps": 4}, checkpoint={"every": 2}, logging={"loggers": ["jsonl"]}
    )
    a, a_err = start([path], tmp_path, env=pause_checkpoint_env(tmp_path, 2))
    try:
        wait_for_line(a, "checkpoint write in progress at step 2")
        b = run_cli(path, "train.lr=0.01")
        assert b.returncode == 2, b.stderr
        assert f"in use by another run: pid {a.pid} on host {socket.gethostname()}" in b.stderr
        assert "Traceback" not in b.stderr
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
    root = tmp_path / "shared/checkpoints"
    assert (root / ".tmp-step-000002").is_dir()
    c = run_cli(path)
    assert c.returncode == 0, c.stderr
    assert f"left by pid {a.pid}" in c.stderr and "no longer running" in c.stderr
    assert "removed 1 unfinished write(s)" in c.stdout
    assert not (root / ".tmp-step-000002").exists()
    assert [r["step"] for r in read_metrics(tmp_path / "shared")] == [1, 2, 3, 4]


@pytest.mark.distributed
def test_every_rank_of_a_multi_process_run_stops_when_the_directory_is_locked(tmp_path):
    """Rank 0 finds the lock held; rank 1 waits for its verdict, so both stop (no hang)
    and the message is printed once. (torchrun's agent adds its own report of the
    failed workers.)"""
    path = config_file(tmp_path, "ddp", train={"steps": 2})
    lock = RunLock.acquire(tmp_path / "ddp")
    try:
        result = run_cli("--nproc", "2", path, "parallel.dp_replicate=2", timeout=180)
    finally:
        lock.release()
    assert result.returncode != 0
    assert result.stderr.count(f"is in use by another run: pid {os.getpid()}") == 1, result.stderr
    assert "forge_core/" not in result.stderr  # no traceback from a worker
    assert not (tmp_path / "ddp/config.yaml").exists()


# --- out_dir that cannot be used ----------------------------------------------------


def test_out_dir_that_is_a_file_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "afile").write_text("not a directory")
    path = write_config(
        tmp_path / "c.yaml", tiny_config(tmp_path, "x", run={"out_dir": str(tmp_path / "afile")})
    )
    assert cli.main([path]) == 2
    err = capsys.readouterr().err
    # Refused by the kernel's run.out-dir rule before anything is built.
    assert (
        "[run.out-dir]" in err
        and f"run.out_dir {str(tmp_path / 'afile')!r} exists and is not a directory" in err
    )
    assert "Traceback" not in err


def test_out_dir_that_is_a_file_is_refused_at_build_too(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    with pytest.raises(ForgeError) as info:
        RunLock.acquire(tmp_path / "afile")
    assert str(info.value).startswith(
        f"$.run.out_dir: {str(tmp_path / 'afile')!r} exists and is not a "
        f"directory. Set run.out_dir to a directory you can write"
    )


def test_out_dir_below_a_file_is_a_clean_error(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ForgeError) as info:
        RunLock.acquire(tmp_path / "afile/run")
    assert str(info.value).startswith(
        f"$.run.out_dir: {str(tmp_path / 'afile/run')!r} cannot be created: "
        f"{str(tmp_path / 'afile')!r} is a file. Set run.out_dir"
    )


def test_the_run_refuses_an_out_dir_for_the_reason_check_gives(tmp_path, monkeypatch):
    """One definition of what makes a directory unusable: the lock refuses with the
    words of the run.out-dir rule (the permission answer faked: root writes anywhere)."""
    from forge_core.core_rules import check_out_dir

    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: os.fspath(p) != str(locked))
    plan = SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(out_dir=str(locked / "run"))))
    assert check_out_dir(plan) == (
        f"run.out_dir {str(locked / 'run')!r} cannot be created: {str(locked)!r} is not writable by this user"
    )
    with pytest.raises(ForgeError) as info:
        RunLock.acquire(locked / "run")
    assert str(info.value).startswith(
        f"$.run.out_dir: {str(locked / 'run')!r} cannot be created: "
        f"{str(locked)!r} is not writable by this user. "
    )
    assert not (locked / "run").exists()


def test_unwritable_out_dir_is_a_clean_error(tmp_path, monkeypatch):
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith(LOCK):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(ForgeError, match=r"\$\.run\.out_dir: cannot write in .*\(Permission denied\)"):
        RunLock.acquire(tmp_path / "ro")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_out_dir_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        path = write_config(
            tmp_path / "c.yaml", tiny_config(tmp_path, "x", run={"out_dir": str(tmp_path / "ro")})
        )
        assert cli.main([path]) == 2
        # The run.out-dir rule refuses it before the run reaches the directory.
        assert f"run.out_dir {str(tmp_path / 'ro')!r} is not writable by this user" in capsys.readouterr().err
    finally:
        (tmp_path / "ro").chmod(0o700)


# --- a full disk --------------------------------------------------------------------


def test_restart_on_a_full_disk_cleans_up_then_says_so(tmp_path, monkeypatch, capsys):
    """Leftover temporaries are removed under the lock first (freeing their space); a
    config.yaml that still does not fit is a clean error, exit 2."""
    path = config_file(tmp_path, train={"steps": 2})
    stale = tmp_path / "run/checkpoints/.tmp-step-000008"
    stale.mkdir(parents=True)
    (stale / "__0_0.distcp").write_bytes(b"x" * 1000)

    def full(target, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(rundir, "atomic_write", full)
    assert cli.main([path]) == 2
    captured = capsys.readouterr()
    assert "removed 1 unfinished write(s)" in captured.out and not stale.exists()
    assert (
        f"No space left on device writing the run directory ({tmp_path / 'run/config.yaml'})" in captured.err
    )
    assert "Traceback" not in captured.err and not (tmp_path / "run" / LOCK).exists()


def test_disk_full_during_training_exits_2_and_keeps_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    path = config_file(
        tmp_path, train={"steps": 4}, checkpoint={"every": 2}, logging={"loggers": ["jsonl", "plot"]}
    )
    import torch.distributed.checkpoint.filesystem as fs

    real = fs._write_item

    def fill_up(transforms, stream, *args, **kwargs):
        if ".tmp-step-000004" in str(getattr(stream, "name", "")):  # the first checkpoint fits
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(transforms, stream, *args, **kwargs)

    monkeypatch.setattr(fs, "_write_item", fill_up)
    assert cli.main([path]) == 2
    err = capsys.readouterr().err
    assert "error: No space left on device writing checkpoint step-000004" in err and "Traceback" not in err
    root = tmp_path / "run/checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002"]
    monkeypatch.setattr(fs, "_write_item", real)
    assert cli.main([path]) == 0  # space freed: resumes from step 2
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3, 4]


# --- the metrics file ---------------------------------------------------------------


def test_jsonl_is_cut_short_in_place_on_resume(tmp_path):
    """The resumed run keeps the same file (no replacement that would orphan a writer),
    cut after the checkpoint's step (later lines and a torn one dropped)."""
    path = config_file(tmp_path, train={"steps": 4}, checkpoint={"every": 2}, logging={"loggers": ["jsonl"]})
    assert cli.main([path]) == 0
    metrics = tmp_path / "run/metrics.jsonl"
    inode = metrics.stat().st_ino
    root = tmp_path / "run/checkpoints"
    shutil.rmtree(root / "step-000004")
    (root / "latest").write_text("step-000002\n")
    with open(metrics, "a") as f:
        f.write('{"step": 5, "loss": 1.0}\n{"step": 6, "lo')
    assert cli.main([path]) == 0
    assert metrics.stat().st_ino == inode
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3, 4]
