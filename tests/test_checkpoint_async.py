"""``checkpoint.async: true``: the YAML key, background saves that training outruns
(the copy is the state of the save's step, ``latest`` moves only once the files are on
disk), a failure of one stopping the run, and exact resume after SIGTERM. SIGKILL while
a background save is in flight is in test_train_cli.py (a real process); two processes
under FSDP in tests/distributed/test_elastic_resume.py."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from test_train_checkpoint import model_and_optimizer
from test_train_loop import final_weights, run
from train_helpers import Recorder, SignalAt, tiny_config, write_config

from forge_core.api import ForgeError, hookimpl
from forge_core.api.rules import get_path
from forge_core.config import load_config, to_plain
from forge_core.config.errors import ConfigError
from forge_core.train import checkpoint
from forge_core.train.checkpoint import MANIFEST, CheckpointManager, find_latest, model_state, problem_with


def test_the_yaml_key_is_async(tmp_path):
    path = write_config(tmp_path / "c.yaml", tiny_config(tmp_path, checkpoint={"async": True}))
    config = load_config(path)
    assert config.checkpoint.async_save is True and get_path(config, "checkpoint.async") is True
    assert to_plain(config)["checkpoint"]["async"] is True  # the run directory's config loads again
    assert load_config(path, ["checkpoint.async=false"]).checkpoint.async_save is False
    with pytest.raises(ConfigError) as bad:
        load_config(path, ["checkpoint.async=sometimes"])
    assert ("$.checkpoint.async", "expected true or false, got 'sometimes' (str)") in bad.value.issues
    path = write_config(tmp_path / "d.yaml", tiny_config(tmp_path, checkpoint={"async_save": True}))
    with pytest.raises(ConfigError) as bad:
        load_config(path)
    ((where, message),) = bad.value.issues
    assert where == "$.checkpoint" and "unknown key 'async_save'. Did you mean 'async'?" in message


class Gate:
    """Holds the background half of the saves of ``step`` at the manifest (files
    written, nothing vouching for them yet) until :meth:`open`; ``fail`` makes it raise
    a full disk there instead."""

    def __init__(self, monkeypatch, step: int, fail: bool = False) -> None:
        self.tmp_name = f".tmp-{checkpoint.step_name(step)}"
        self.reached = threading.Event()
        self.released = threading.Event()
        real = checkpoint.digests

        def digests(paths):
            if paths and paths[0].parent.name == self.tmp_name:
                self.reached.set()
                if fail:
                    raise OSError(errno.ENOSPC, "No space left on device")
                assert self.released.wait(60)
            return real(paths)

        monkeypatch.setattr(checkpoint, "digests", digests)

    def open(self) -> None:
        self.released.set()


def test_training_outruns_a_background_save_and_latest_moves_once_it_is_on_disk(tmp_path, monkeypatch):
    model, optimizer = model_and_optimizer()
    manager = CheckpointManager(tmp_path, keep=5, rank=0, world_size=1, background=True)
    manager.save(2, [model], [optimizer], {"step": 2})
    manager.wait()
    gate = Gate(monkeypatch, 4)
    at_save = {k: v.clone() for k, v in model_state([model]).items()}
    announced = []
    path = manager.save(4, [model], [optimizer], {"step": 4}, saved=announced.append)
    assert gate.reached.wait(60)
    with torch.no_grad():  # the next step changes the parameters in place while it is written
        for p in model.parameters():
            p.add_(1.0)
    root = tmp_path / "checkpoints"
    manager.poll()
    assert announced == [] and not path.exists() and not (root / gate.tmp_name / MANIFEST).exists()
    assert find_latest(root) == root / "step-000002"  # the save in flight is never picked
    gate.open()
    manager.wait()
    assert announced == [path] and (root / "latest").read_text() == "step-000004\n"
    assert problem_with(path) is None
    fresh, _ = model_and_optimizer(seed=1)
    checkpoint.load_model(path, [fresh])
    saved = model_state([fresh])
    assert all(torch.equal(saved[k], at_save[k]) for k in at_save)  # the copy, not the moved weights


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_every_file_is_on_disk_before_the_manifest_names_it(tmp_path, monkeypatch, background):
    """A file a plugin adds without flushing it is flushed before the manifest is
    written (a crash after ``latest`` moved can then not leave it short)."""
    events = []
    real_fsync, real_write = os.fsync, checkpoint.atomic_write

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def atomic_write(path, data):
        events.append(("write", Path(path).name))
        return real_write(path, data)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(checkpoint, "atomic_write", atomic_write)
    model, optimizer = model_and_optimizer()
    manager = CheckpointManager(tmp_path, keep=2, rank=0, world_size=1, background=background)
    unflushed = lambda tmp: (tmp / "cursor").write_text("7")  # noqa: E731
    path = manager.save(2, [model], [optimizer], {"step": 2}, writing=unflushed)
    manager.wait()
    listed = json.loads((path / MANIFEST).read_text())["files"]
    before = events[: events.index(("write", MANIFEST))]
    assert "cursor" in listed and {n for what, n in before if what == "fsync"} >= set(listed)


def test_a_full_disk_in_a_background_save_stops_the_run_at_the_next_step(tmp_path, monkeypatch):
    """Not at the next save, 4 steps later: the step after the failure is known stops
    with the error a synchronous save gives; nothing of the failed save is left."""
    gate = Gate(monkeypatch, 4, fail=True)

    class AfterTheFailure:
        """Holds step 5 until the background save has ended (deterministic: the loop
        then finds it failed at the end of this step)."""

        @hookimpl
        def forge_step_end(self, step):
            if step == 5:
                deadline = time.monotonic() + 60
                while any(t.name.startswith("forge-checkpoint") for t in threading.enumerate()):
                    assert time.monotonic() < deadline
                    time.sleep(0.01)

    rec = Recorder()
    cfg = tiny_config(tmp_path, "full", train={"steps": 12}, checkpoint={"every": 4, "async": True})
    with pytest.raises(ForgeError, match="No space left on device writing checkpoint step-000004") as err:
        run(tmp_path, cfg, rec, AfterTheFailure())
    assert gate.reached.is_set() and rec.end == (5, "failed") and rec.saved == []
    assert "The partial write was removed; no checkpoint of this run exists yet" in str(err.value)
    assert sorted(p.name for p in (tmp_path / "full/checkpoints").iterdir()) == []


def test_sigterm_waits_for_the_background_save_and_resumes_exactly(tmp_path, monkeypatch):
    """SIGTERM at step 3 with the save of step 2 in flight: the stop waits for it, saves
    step 3, and the process ends only once that is complete (``forge_train_end`` already
    sees ``latest`` on it); resumed, the run is the straight one bit for bit."""
    train_cfg = {"steps": 6}
    straight = Recorder()
    assert run(tmp_path, tiny_config(tmp_path, "straight", train=train_cfg), straight) == "completed"

    real = checkpoint.digests

    def slow_digests(paths):  # a slow disk: without the wait the process would end first
        time.sleep(0.3)
        return real(paths)

    monkeypatch.setattr(checkpoint, "digests", slow_digests)
    latest_at_end = []

    class LatestAtEnd:
        @hookimpl
        def forge_train_end(self, run, step, status):
            latest_at_end.append((tmp_path / "resumed/checkpoints/latest").read_text().strip())

    first = Recorder()
    cfg = tiny_config(tmp_path, "resumed", train=train_cfg, checkpoint={"every": 2, "keep": 5, "async": True})
    assert run(tmp_path, cfg, first, SignalAt(3), LatestAtEnd()) == "interrupted"
    assert latest_at_end == ["step-000003"] and first.saved == [2, 3]
    monkeypatch.setattr(checkpoint, "digests", real)
    second = Recorder()
    assert run(tmp_path, cfg, second, LatestAtEnd()) == "completed"
    assert second.start.start_step == 3 and latest_at_end[-1] == "step-000006"
    for step in range(1, 7):
        got = (first.metrics if step <= 3 else second.metrics)[step]
        assert got["loss"] == straight.metrics[step]["loss"], step
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
