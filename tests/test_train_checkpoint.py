"""Checkpoint bookkeeping: complete vs half-written checkpoints, the ``latest`` pointer,
keep-K, checksums (damage that keeps the size), a full disk, and the JSON train state
(exact round trip of RNG and loader state)."""

from __future__ import annotations

import errno
import hashlib
import json
import random
import shutil
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from forge_core.api import ForgeError
from forge_core.train import train_state
from forge_core.train.checkpoint import (
    MANIFEST,
    CheckpointManager,
    complete_checkpoints,
    find_latest,
    problem_with,
    remove_stale_temporaries,
    resolve_checkpoint,
)


def model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 11))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.arange(5).unsqueeze(0)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def save_steps(tmp_path, steps, keep=10):
    model, optimizer = model_and_optimizer()
    manager = CheckpointManager(tmp_path, keep=keep, rank=0, world_size=1)
    for step in steps:
        manager.save(step, [model], [optimizer], {"step": step})
    return manager, model, optimizer


def test_save_load_round_trip(tmp_path):
    manager, model, optimizer = save_steps(tmp_path, [3])
    path = tmp_path / "checkpoints/step-000003"
    assert problem_with(path) is None and (tmp_path / "checkpoints/latest").read_text() == "step-000003\n"
    other, other_opt = model_and_optimizer(seed=1)
    state = manager.load(path, [other], [other_opt])
    assert state == {"step": 3, "world_size": 1}
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    sa, sb = optimizer.state_dict()["state"], other_opt.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)


def test_keep_last_k(tmp_path):
    save_steps(tmp_path, [1, 2, 3, 4], keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step-000003", "step-000004"]


def test_truncated_latest_is_skipped_with_a_warning(tmp_path):
    save_steps(tmp_path, [2, 4])
    data = next((tmp_path / "checkpoints/step-000004").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    warnings = []
    found = find_latest(tmp_path / "checkpoints", warnings.append)
    assert found.name == "step-000002"
    assert len(warnings) == 1 and "step-000004" in warnings[0] and "truncated" in warnings[0]


def test_half_written_and_pointerless_checkpoints(tmp_path):
    save_steps(tmp_path, [2, 4, 6])
    root = tmp_path / "checkpoints"
    # A write killed before its manifest, renamed by hand; and a temp dir of a later step.
    (root / "step-000006" / MANIFEST).unlink()
    shutil.copytree(root / "step-000004", root / ".tmp-step-000008")
    (root / ".tmp-step-000008" / MANIFEST).unlink()
    (root / "latest").unlink()
    warnings = []
    assert find_latest(root, warnings.append).name == "step-000004"
    assert any("step-000006" in w and MANIFEST in w for w in warnings)
    assert [p.name for p in complete_checkpoints(root)] == ["step-000002", "step-000004"]


def test_resolve_checkpoint_from_run_dir_or_checkpoint_dir(tmp_path):
    save_steps(tmp_path, [1, 2])
    assert resolve_checkpoint(tmp_path) == (tmp_path / "checkpoints/step-000002", tmp_path)
    assert resolve_checkpoint(tmp_path / "checkpoints/step-000001") == (
        tmp_path / "checkpoints/step-000001",
        tmp_path,
    )
    with pytest.raises(ForgeError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path / "nowhere")


def test_load_on_fewer_processes_takes_its_rank_state_and_warns(tmp_path):
    """A checkpoint of 2 processes loads in 1: process 0 continues process 0's train
    state, and the warning says what cannot carry over (the random streams)."""
    manager, model, optimizer = save_steps(tmp_path, [1])
    path = tmp_path / "checkpoints/step-000001"
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["world_size"] = 2
    (path / "manifest.json").write_text(json.dumps(manifest))
    data = json.loads((path / "train_state-rank00000.json").read_text())
    (path / "train_state-rank00001.json").write_text(json.dumps({**data, "step": 99}))
    warned = []
    state = CheckpointManager(tmp_path, keep=2, rank=0, world_size=1).load(
        path, [model], [optimizer], warned.append
    )
    assert state["step"] == 1
    assert len(warned) == 1 and "written by 2 processes; resuming on 1" in warned[0]
    assert "Random number streams are per process" in warned[0]
    assert "the streams of process 0 go on, those of process 1 are dropped" in warned[0]
    # on more processes than saved, process r continues process r mod N
    grown = CheckpointManager(tmp_path, keep=2, rank=3, world_size=4).load(
        path, [model], [optimizer], warned.append
    )
    assert grown["step"] == 99  # rank 3 -> saved rank 1
    assert "processes 2-3 start from copies of the streams of processes 0-1" in warned[1]


def test_train_state_round_trips_rng_and_nested_values(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = {
        "rng": train_state.capture_rng(torch.device("cpu")),
        "loader": {
            "epoch": 3,
            "batch": 7,
            "big": 2**100,
            "arr": np.arange(6, dtype=np.uint32).reshape(2, 3),
            "pair": (1, "a"),
            "x": np.float64(0.5),
        },
    }
    expected = (random.random(), np.random.rand(), torch.rand(2))
    train_state.write(tmp_path / "s.json", state)
    back = train_state.read(tmp_path / "s.json")
    assert back["loader"]["big"] == 2**100 and back["loader"]["pair"] == (1, "a")
    assert back["loader"]["arr"].dtype == np.uint32 and back["loader"]["arr"].shape == (2, 3)
    train_state.restore_rng(back["rng"], torch.device("cpu"))
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


# --- damage that keeps the size -----------------------------------------------------


def xor_bytes(path, offset=100, count=64):
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def rewrite(checkpoint, name, data, manifest_too):
    """Replace a checkpoint's file; ``manifest_too``: update its size and checksum to match."""
    (checkpoint / name).write_bytes(data)
    if manifest_too:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        manifest["files"][name] = len(data)
        manifest["sha256"][name] = hashlib.sha256(data).hexdigest()
        (checkpoint / MANIFEST).write_text(json.dumps(manifest))


def test_manifest_records_size_and_sha256_of_every_file(tmp_path):
    save_steps(tmp_path, [1])
    path = tmp_path / "checkpoints/step-000001"
    manifest = json.loads((path / MANIFEST).read_text())
    names = sorted(p.name for p in path.iterdir() if p.name != MANIFEST)
    assert sorted(manifest["files"]) == sorted(manifest["sha256"]) == names
    for name in names:
        assert manifest["sha256"][name] == hashlib.sha256((path / name).read_bytes()).hexdigest()


DAMAGE = {
    "xor-distcp": lambda ck: xor_bytes(next(ck.glob("*.distcp"))),
    "random-metadata": lambda ck: rewrite(
        ck, ".metadata", random.Random(0).randbytes((ck / ".metadata").stat().st_size), manifest_too=False
    ),
    "random-metadata-manifest-updated": lambda ck: rewrite(
        ck, ".metadata", random.Random(0).randbytes((ck / ".metadata").stat().st_size), manifest_too=True
    ),
    "bad-train-state": lambda ck: rewrite(
        ck, "train_state-rank00000.json", b'{"format": 1, "step": ', manifest_too=False
    ),
    "bad-train-state-manifest-updated": lambda ck: rewrite(
        ck, "train_state-rank00000.json", b'{"format": 1, "step": ', manifest_too=True
    ),
    "train-state-not-utf8": lambda ck: rewrite(
        ck, "train_state-rank00000.json", b"\xff\xfe{}", manifest_too=True
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage):
    save_steps(tmp_path, [2, 4])
    DAMAGE[damage](tmp_path / "checkpoints/step-000004")
    warnings = []
    assert find_latest(tmp_path / "checkpoints", warnings.append).name == "step-000002"
    assert len(warnings) == 1 and "skipping checkpoint" in warnings[0] and "step-000004" in warnings[0]
    assert resolve_checkpoint(tmp_path)[0].name == "step-000002"
    with pytest.raises(ForgeError, match="step-000004 cannot be used"):
        resolve_checkpoint(tmp_path / "checkpoints/step-000004")


def test_xor_damage_is_named_as_a_checksum_mismatch(tmp_path):
    save_steps(tmp_path, [2])
    path = tmp_path / "checkpoints/step-000002"
    xor_bytes(path / "__0_0.distcp")
    assert "__0_0.distcp does not match its SHA-256" in problem_with(path)


@pytest.mark.parametrize("pointer", ["not-utf8", "directory", "garbage-name", "traversal"])
def test_unusable_latest_pointer_falls_back_with_a_warning(tmp_path, pointer):
    save_steps(tmp_path, [2, 4])
    latest = tmp_path / "checkpoints/latest"
    latest.unlink()
    if pointer == "not-utf8":
        latest.write_bytes(b"step-\xff\xfe000004\n")
    elif pointer == "directory":
        latest.mkdir()
    elif pointer == "garbage-name":
        latest.write_text("step-4; rm -rf /\n")
    else:
        latest.write_text("../../step-000004\n")
    warnings = []
    assert find_latest(tmp_path / "checkpoints", warnings.append).name == "step-000004"
    assert len(warnings) == 1 and "latest" in warnings[0]


def test_a_save_replaces_a_latest_that_is_a_directory(tmp_path):
    manager, model, optimizer = save_steps(tmp_path, [2])
    latest = tmp_path / "checkpoints/latest"
    latest.unlink()
    latest.mkdir()
    manager.save(3, [model], [optimizer], {"step": 3})
    assert latest.read_text() == "step-000003\n"


def test_checkpoint_without_checksums_is_accepted_with_a_warning(tmp_path):
    """Checkpoints of older Forge versions (sizes only) still resume, with a warning."""
    save_steps(tmp_path, [2])
    path = tmp_path / "checkpoints/step-000002"
    manifest = json.loads((path / MANIFEST).read_text())
    del manifest["sha256"]
    (path / MANIFEST).write_text(json.dumps(manifest))
    warnings = []
    assert find_latest(tmp_path / "checkpoints", warnings.append) == path
    assert len(warnings) == 1 and "no checksums" in warnings[0] and "size only" in warnings[0]


def test_pruning_never_deletes_the_last_checkpoint_that_verified(tmp_path):
    """The issue's case: the newest of two checkpoints is damaged (same size). Resume
    falls back to the older one; the next saves keep it until newer good ones exist."""
    save_steps(tmp_path, [2, 4], keep=2)
    root = tmp_path / "checkpoints"
    xor_bytes(root / "step-000004/__0_0.distcp")
    model, optimizer = model_and_optimizer(seed=3)
    manager = CheckpointManager(tmp_path, keep=2, rank=0, world_size=1)  # a restart
    found = manager.find_resume(lambda m: None)
    assert found.name == "step-000002"
    manager.load(found, [model], [optimizer])
    manager.save(3, [model], [optimizer], {"step": 3})
    names = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
    assert names == ["step-000002", "step-000003", "step-000004"]
    manager.save(4, [model], [optimizer], {"step": 4})  # replaces the damaged step 4
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == [
        "step-000003",
        "step-000004",
    ]
    assert all(problem_with(root / n) is None for n in ("step-000003", "step-000004"))


def test_a_damaged_checkpoint_does_not_count_toward_keep(tmp_path):
    save_steps(tmp_path, [1, 2, 3], keep=3)
    root = tmp_path / "checkpoints"
    xor_bytes(root / "step-000003/__0_0.distcp")
    model, optimizer = model_and_optimizer(seed=3)
    CheckpointManager(tmp_path, keep=3, rank=0, world_size=1).save(4, [model], [optimizer], {"step": 4})
    assert [p.name for p in complete_checkpoints(root)] == ["step-000001", "step-000002", "step-000004"]
    assert not (root / "step-000003").exists()


# --- a full disk --------------------------------------------------------------------

Usage = namedtuple("Usage", "total used free")


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def short_write(*args, **kwargs):
    """What torch's zip writer reports when the disk fills under it."""
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


@pytest.mark.parametrize("where", ["dcp-oserror", "dcp-short-write", "train-state", "manifest"])
def test_disk_full_during_a_save_is_a_clean_error_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, where
):
    manager, model, optimizer = save_steps(tmp_path, [2])
    root = tmp_path / "checkpoints"
    before = {p.name: p.read_bytes() for p in (root / "step-000002").iterdir()}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1234, 1234))
    if where.startswith("dcp"):
        import torch.distributed.checkpoint.filesystem as fs

        monkeypatch.setattr(fs, "_write_item", no_space if where == "dcp-oserror" else short_write)
    elif where == "train-state":
        monkeypatch.setattr(train_state, "write", no_space)
    else:
        import forge_core.train.checkpoint as checkpoint

        real = checkpoint.atomic_write
        monkeypatch.setattr(
            checkpoint,
            "atomic_write",
            lambda path, text: no_space() if path.name == MANIFEST else real(path, text),
        )
    with pytest.raises(ForgeError) as info:
        manager.save(4, [model], [optimizer], {"step": 4})
    message = str(info.value)
    assert message.startswith("No space left on device writing checkpoint step-000004")
    assert "0.0 MB free there" in message and "were needed" in message
    assert "step-000002) is intact" in message
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002"]  # partial write removed
    assert (root / "latest").read_text() == "step-000002\n"
    assert {p.name: p.read_bytes() for p in (root / "step-000002").iterdir()} == before


def test_a_short_write_with_room_left_is_not_called_a_full_disk(tmp_path, monkeypatch):
    manager, model, optimizer = save_steps(tmp_path, [2])
    import torch.distributed.checkpoint.filesystem as fs

    monkeypatch.setattr(fs, "_write_item", short_write)
    with pytest.raises(BaseException, match="unexpected pos") as info:
        manager.save(4, [model], [optimizer], {"step": 4})
    assert not isinstance(info.value, ForgeError)
    assert not (tmp_path / "checkpoints/.tmp-step-000004").exists()


def test_stale_temporaries_are_removed(tmp_path):
    save_steps(tmp_path, [2])
    root = tmp_path / "checkpoints"
    shutil.copytree(root / "step-000002", root / ".tmp-step-000004")
    (root / ".latest.tmp4242").write_text("step-000004\n")
    (tmp_path / ".config.yaml.tmp77").write_text("x")
    (tmp_path / "keep.txt").write_text("mine")
    removed, freed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == [".config.yaml.tmp77", ".latest.tmp4242", ".tmp-step-000004"]
    assert freed > 0 and (tmp_path / "keep.txt").exists() and problem_with(root / "step-000002") is None


# --- the forge_checkpoint_writing hook ------------------------------------------------


def test_files_added_while_writing_are_part_of_the_checkpoint(tmp_path):
    """What ``writing`` adds to the temporary directory is listed with its checksum, so
    damage to it makes the checkpoint unusable like damage to the weights."""
    seen = []

    def add_cursor(tmp):
        seen.append((tmp.name, (tmp / "train_state-rank00000.json").is_file(), (tmp / MANIFEST).exists()))
        (tmp / "my_cursor.json").write_text('{"position": 7}')

    model, optimizer = model_and_optimizer()
    manager = CheckpointManager(tmp_path, keep=2, rank=0, world_size=1)
    path = manager.save(4, [model], [optimizer], {"step": 4}, writing=add_cursor)
    assert seen == [(".tmp-step-000004", True, False)]  # the state written, the manifest not yet
    manifest = json.loads((path / MANIFEST).read_text())
    data = b'{"position": 7}'
    assert manifest["files"]["my_cursor.json"] == len(data)
    assert manifest["sha256"]["my_cursor.json"] == hashlib.sha256(data).hexdigest()
    assert problem_with(path) is None
    (path / "my_cursor.json").write_text('{"position": 8}')
    assert problem_with(path) == (
        f"my_cursor.json does not match its SHA-256 in {MANIFEST} (damaged after it was written)"
    )


def test_a_failure_while_writing_removes_the_partial_checkpoint(tmp_path):
    manager, model, optimizer = save_steps(tmp_path, [2])
    root = tmp_path / "checkpoints"

    def refuse(tmp):
        raise RuntimeError("the plugin's own state cannot be saved")

    with pytest.raises(RuntimeError, match="the plugin's own state cannot be saved"):
        manager.save(4, [model], [optimizer], {"step": 4}, writing=refuse)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002"]
    assert (root / "latest").read_text() == "step-000002\n"


def test_the_trainer_calls_forge_checkpoint_writing_before_the_checkpoint_is_complete(tmp_path):
    """A plugin registered for the run sees the temporary directory of every save, with
    ``latest`` still on the previous checkpoint, and the file it writes there is in the
    checkpoint ``forge_checkpoint_saved`` then reports."""
    from train_helpers import tiny_config, write_config

    from forge_core.api import hookimpl
    from forge_core.testing import train_in_process as train

    class Cursor:
        def __init__(self):
            self.events = []

        @hookimpl
        def forge_checkpoint_writing(self, run, step, path):
            latest = tmp_path / "run/checkpoints/latest"
            named = latest.read_text().strip() if latest.exists() else None
            self.events.append(("writing", step, path, named))
            Path(path, "cursor.json").write_text(json.dumps({"step": step}))

        @hookimpl
        def forge_checkpoint_saved(self, run, step, path):
            cursor = json.loads(Path(path, "cursor.json").read_text())
            self.events.append(("saved", step, path, cursor["step"]))

    plugin = Cursor()
    cfg = tiny_config(tmp_path, "run", train={"steps": 4}, checkpoint={"every": 2})
    train(write_config(tmp_path / "run.yaml", cfg), extra_plugins=(("cursor", plugin),))
    root = tmp_path / "run/checkpoints"
    assert plugin.events == [
        ("writing", 2, str(root / ".tmp-step-000002"), None),
        ("saved", 2, str(root / "step-000002"), 2),
        ("writing", 4, str(root / ".tmp-step-000004"), "step-000002"),
        ("saved", 4, str(root / "step-000004"), 4),
    ]
    assert "cursor.json" in json.loads((root / "step-000004" / MANIFEST).read_text())["sha256"]
