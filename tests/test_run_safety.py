"""Nothing a user types destroys a run or ends in a traceback: ``export-hf`` into the
run it exports (or a folder holding one, or through a symlink), a run directory whose
checkpoints are all damaged, pruning after a kill, checkpoint metadata and train states
crafted to lie, two ``prepare`` runs on one output, and a tracking server that cannot
be reached. Every hostile input is built here, on a copy of one tiny trained run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from train_helpers import tiny_config, write_config

from forge_core.testing import forge_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run with two checkpoints (steps 2 and 4) that each test copies."""
    base = tmp_path_factory.mktemp("safety")
    cfg = tiny_config(base, "run", train={"steps": 4}, checkpoint={"every": 2, "keep": 2})
    cfg["logging"] = {"loggers": ["jsonl"]}
    result = forge_run([write_config(base / "run.yaml", cfg)])
    assert result.code == 0, result.output
    return base, cfg


def copy_run(trained, tmp_path: Path, **train) -> tuple[Path, str]:
    """A copy of the trained run in ``tmp_path/run`` and its config (``train`` updated)."""
    base, cfg = trained
    run_dir = tmp_path / "run"
    shutil.copytree(base / "run", run_dir)
    cfg = {**cfg, "run": {**cfg["run"], "out_dir": str(run_dir)}, "train": {**cfg["train"], **train}}
    return run_dir, write_config(tmp_path / "run.yaml", cfg)


def run_files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


# --- export-hf never replaces a run ------------------------------------------------


@pytest.mark.parametrize("where", ["the-run", "inside", "parent", "link-to-run"])
def test_export_into_the_run_it_exports_is_refused_and_the_run_is_untouched(trained, tmp_path, where):
    run_dir, _ = copy_run(trained, tmp_path)
    before = run_files(run_dir)
    out = {
        "the-run": run_dir,
        "inside": run_dir / "checkpoints" / "hf",
        "parent": tmp_path,
        "link-to-run": tmp_path / "link",
    }[where]
    if where == "link-to-run":
        out.symlink_to(run_dir, target_is_directory=True)
    result = forge_run(["export-hf", run_dir, out, "--overwrite"])
    assert result.code == 2, result.output
    assert "the run directory" in result.stderr and "being exported" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert run_files(run_dir) == before
    assert not list(tmp_path.rglob("*.partial")) and not list(tmp_path.rglob("*.old"))


def test_overwrite_of_a_folder_holding_another_run_is_refused(trained, tmp_path):
    run_dir, _ = copy_run(trained, tmp_path)
    other = tmp_path / "runs"
    shutil.copytree(run_dir, other / "older-run")
    before = run_files(other)
    result = forge_run(["export-hf", run_dir, other, "--overwrite"])
    assert result.code == 2, result.output
    assert "holds a Forge run or checkpoint" in result.stderr and "older-run" in result.stderr
    assert run_files(other) == before


def test_export_through_a_symlink_replaces_the_folder_it_points_to(trained, tmp_path):
    """The link is kept and shows the new export; nothing is left half-moved."""
    run_dir, _ = copy_run(trained, tmp_path)
    target = tmp_path / "exports" / "model"
    target.mkdir(parents=True)
    (target / "stale.txt").write_text("from an earlier export")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    result = forge_run(["export-hf", run_dir, link, "--overwrite"])
    assert result.code == 0, result.output
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert (target / "config.json").is_file() and not (target / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exports", "link", "run", "run.yaml"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]
    # A link to nowhere yet: the export is made where it points.
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "exports" / "new", target_is_directory=True)
    assert forge_run(["export-hf", run_dir, dangling]).code == 0
    assert dangling.is_symlink() and (tmp_path / "exports/new/config.json").is_file()
