"""A checkpoint from someone else runs no code: a crafted ``.metadata`` (a plain payload,
and one that wraps the real metadata so loading would otherwise succeed) and a crafted
non-tensor blob in ``__0_0.distcp`` are refused by every path that reads a checkpoint
(resume, ``sample``, ``export-hf``, :func:`load_model`), with the manifest's sizes and
checksums updated to match so only the content can give them away. Each test first
shows that plain DCP would run the payload (the marker file appears), then that Forge
refuses it and the marker never appears."""

from __future__ import annotations

import operator
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_train_checkpoint import model_and_optimizer, rewrite, save_steps
from train_helpers import tiny_config, write_config

from forge_core import cli
from forge_core.train.checkpoint import CheckpointManager, find_latest, load_model
from forge_core.train.checkpoint_reader import ALLOWED_GLOBALS, UnsafeCheckpoint, read_metadata


class Command:
    """Unpickles as ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Wrapped:
    """Unpickles as ``(os.system(command), metadata)[1]``: the real metadata, after the
    command ran, so the load would go on as if nothing happened."""

    def __init__(self, command: str, metadata) -> None:
        self.command, self.metadata = command, metadata

    def __reduce__(self):
        return (operator.getitem, ((Command(self.command), self.metadata), 1))


def crafted_metadata(checkpoint: Path, marker: Path, wrap: bool) -> bytes:
    command = f"touch {marker}"
    if not wrap:
        return pickle.dumps(Command(command))
    with open(checkpoint / ".metadata", "rb") as f:
        real = pickle.load(f)  # our own, just written
    return pickle.dumps(Wrapped(command, real))


def crafted_blob(checkpoint: Path, marker: Path) -> bytes:
    """``__0_0.distcp`` with its first item (a non-tensor optimizer value, loaded by DCP
    with ``torch.load(weights_only=False)``) overwritten by a pickle, same size."""
    data = bytearray((checkpoint / "__0_0.distcp").read_bytes())
    payload = pickle.dumps(Command(f"touch {marker}"), protocol=2)
    data[: len(payload)] = payload
    return bytes(data)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run (two checkpoints) that each test copies and tampers with."""
    base = tmp_path_factory.mktemp("untrusted")
    cfg = tiny_config(base, "run", train={"steps": 4}, checkpoint={"every": 2, "keep": 2})
    assert cli.main([write_config(base / "run.yaml", cfg)]) == 0
    return base, cfg


def copy_run(trained, tmp_path: Path) -> tuple[Path, str]:
    base, cfg = trained
    run_dir = tmp_path / "run"
    shutil.copytree(base / "run", run_dir)
    cfg = {**cfg, "run": {**cfg["run"], "out_dir": str(run_dir)}, "train": {**cfg["train"], "steps": 6}}
    return run_dir, write_config(tmp_path / "run.yaml", cfg)


def test_allow_list_is_what_dcp_writes():
    """The unpickler allows DCP's metadata types and a few value types; nothing that
    executes, imports or reads files."""
    flat = {f"{m}.{n}" for m, names in ALLOWED_GLOBALS.items() for n in names}
    for dangerous in (
        "posix.system",
        "os.system",
        "builtins.eval",
        "builtins.exec",
        "builtins.getattr",
        "builtins.__import__",
        "operator.getitem",
        "subprocess.Popen",
        "torch.load",
    ):
        assert dangerous not in flat
    assert "torch.distributed.checkpoint.metadata.Metadata" in flat


@pytest.mark.parametrize("wrap", [False, True], ids=["payload", "wrapping-real-metadata"])
def test_crafted_metadata_runs_under_plain_dcp_and_is_refused_by_forge(tmp_path, wrap):
    save_steps(tmp_path, [1])
    checkpoint = tmp_path / "checkpoints/step-000001"
    marker = tmp_path / "executed"
    rewrite(checkpoint, ".metadata", crafted_metadata(checkpoint, marker, wrap), manifest_too=True)

    # Negative control: DCP's own reader runs it (and, wrapped, returns real metadata).
    from torch.distributed.checkpoint import FileSystemReader

    if wrap:
        assert type(FileSystemReader(str(checkpoint)).read_metadata()).__name__ == "Metadata"
    else:
        with pytest.raises(AttributeError):  # only after the command ran
            FileSystemReader(str(checkpoint)).read_metadata()
    assert marker.exists()
    marker.unlink()

    model, _ = model_and_optimizer()
    for attempt in (
        lambda: read_metadata(checkpoint),
        lambda: find_latest(tmp_path / "checkpoints"),
        lambda: load_model(checkpoint, [model]),
    ):
        with pytest.raises(
            UnsafeCheckpoint,
            match=r"refusing to load .*step-000001/\.metadata.*"
            r"(posix|_operator)\.(system|getitem)",
        ):
            attempt()
    assert not marker.exists()


def test_crafted_optimizer_blob_runs_under_plain_dcp_and_is_refused_by_forge(tmp_path):
    manager, model, optimizer = save_steps(tmp_path, [1])
    checkpoint = tmp_path / "checkpoints/step-000001"
    marker = tmp_path / "executed"
    rewrite(checkpoint, "__0_0.distcp", crafted_blob(checkpoint, marker), manifest_too=True)
    assert find_latest(tmp_path / "checkpoints") == checkpoint  # sizes, checksums, metadata: all fine

    # Negative control: DCP's default planner loads non-tensor items with weights_only=False.
    from forge_core.train.checkpoint import model_state, optimizer_state

    state = {"model": model_state([model]), "optim": optimizer_state([model], [optimizer])}
    try:
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    except BaseException:  # noqa: BLE001 - the payload replaced a value; what follows may fail
        pass
    assert marker.exists()
    marker.unlink()

    with pytest.raises(UnsafeCheckpoint, match=r"__0_0\.distcp.*posix\.system.*optim\.param_groups"):
        CheckpointManager(tmp_path, keep=2, rank=0, world_size=1).load(checkpoint, [model], [optimizer])
    assert not marker.exists()


def test_metadata_reading_outside_the_checkpoint_is_refused(tmp_path):
    """Metadata built only from allowed types can still point a read elsewhere."""
    save_steps(tmp_path, [1])
    checkpoint = tmp_path / "checkpoints/step-000001"
    with open(checkpoint / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    for info in metadata.storage_data.values():
        info.relative_path = "../../../etc/passwd"
    rewrite(checkpoint, ".metadata", pickle.dumps(metadata), manifest_too=True)
    with pytest.raises(UnsafeCheckpoint, match="outside the checkpoint directory"):
        read_metadata(checkpoint)


@pytest.mark.parametrize("wrap", [False, True], ids=["payload", "wrapping-real-metadata"])
def test_every_command_refuses_a_crafted_metadata(trained, tmp_path, capsys, wrap):
    """Resume, sample and export-hf on a run whose newest checkpoint carries the crafted
    ``.metadata``: exit 2, the file named, nothing executed, nothing trained."""
    run_dir, config = copy_run(trained, tmp_path)
    checkpoint = run_dir / "checkpoints/step-000004"
    marker = tmp_path / "executed"
    rewrite(checkpoint, ".metadata", crafted_metadata(checkpoint, marker, wrap), manifest_too=True)
    capsys.readouterr()
    for argv in (
        [config],
        ["sample", str(run_dir), "--max-new-tokens", "2"],
        ["sample", str(checkpoint)],
        ["export-hf", str(run_dir), str(tmp_path / "hf")],
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"refusing to load {checkpoint / '.metadata'}" in err and "Traceback" not in err, argv
        assert not marker.exists(), argv
    assert not (run_dir / "checkpoints/step-000006").exists()
    assert not (tmp_path / "hf/model.safetensors").exists()


def test_resume_refuses_a_crafted_optimizer_blob(trained, tmp_path, capsys):
    run_dir, config = copy_run(trained, tmp_path)
    checkpoint = run_dir / "checkpoints/step-000004"
    marker = tmp_path / "executed"
    rewrite(checkpoint, "__0_0.distcp", crafted_blob(checkpoint, marker), manifest_too=True)
    capsys.readouterr()
    assert cli.main([config]) == 2
    err = capsys.readouterr().err
    assert f"refusing to load {checkpoint / '__0_0.distcp'}" in err and "Traceback" not in err
    assert not marker.exists()
    # The weights alone (sample, export) never read the optimizer's blobs.
    assert cli.main(["sample", str(run_dir), "--max-new-tokens", "2"]) == 0
    assert not marker.exists()


def test_safe_loading_round_trips_every_optimizer_value(tmp_path):
    """weights_only loading of the non-tensor items gives back lr, betas, eps, flags."""
    manager, model, optimizer = save_steps(tmp_path, [1])
    torch.manual_seed(5)
    other = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Linear(6, 11))
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.5, betas=(0.1, 0.2), eps=1e-3)
    manager.load(tmp_path / "checkpoints/step-000001", [other], [other_opt])
    assert other_opt.param_groups[0]["betas"] == optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    for key in ("lr", "eps", "weight_decay", "amsgrad", "maximize"):
        assert other_opt.param_groups[0][key] == optimizer.param_groups[0][key], key
