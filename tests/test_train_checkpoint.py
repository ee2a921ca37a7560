"""Checkpoint bookkeeping: complete vs half-written checkpoints, the ``latest`` pointer,
keep-K, and the JSON train state (exact round trip of RNG and loader state)."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest
import torch

from forge_core.errors import ForgeError
from forge_core.train import train_state
from forge_core.train.checkpoint import (
    MANIFEST,
    CheckpointManager,
    complete_checkpoints,
    find_latest,
    problem_with,
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
    assert resolve_checkpoint(tmp_path / "checkpoints/step-000001") == (tmp_path / "checkpoints/step-000001", tmp_path)
    with pytest.raises(ForgeError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path / "nowhere")


def test_load_refuses_another_world_size(tmp_path):
    manager, model, optimizer = save_steps(tmp_path, [1])
    other = CheckpointManager(tmp_path, keep=2, rank=0, world_size=1)
    path = tmp_path / "checkpoints/step-000001"
    state_file = path / "train_state-rank00000.json"
    data = json.loads(state_file.read_text())
    data["world_size"] = 2
    state_file.write_text(json.dumps(data))
    with pytest.raises(ForgeError, match="written by 2 processes"):
        other.load(path, [model], [optimizer])


def test_train_state_round_trips_rng_and_nested_values(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = {
        "rng": train_state.capture_rng(torch.device("cpu")),
        "loader": {"epoch": 3, "batch": 7, "big": 2**100, "arr": np.arange(6, dtype=np.uint32).reshape(2, 3),
                   "pair": (1, "a"), "x": np.float64(0.5)},
    }
    expected = (random.random(), np.random.rand(), torch.rand(2))
    train_state.write(tmp_path / "s.json", state)
    back = train_state.read(tmp_path / "s.json")
    assert back["loader"]["big"] == 2**100 and back["loader"]["pair"] == (1, "a")
    assert back["loader"]["arr"].dtype == np.uint32 and back["loader"]["arr"].shape == (2, 3)
    train_state.restore_rng(back["rng"], torch.device("cpu"))
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
