"""Nothing a user types destroys a run or ends in a traceback: ``export-hf`` into the
run it exports (or a folder holding one, or through a symlink), a run directory whose
checkpoints are all damaged, pruning after a kill, checkpoint metadata and train states
crafted to lie, two ``prepare`` runs on one output, and a tracking server that cannot
be reached. Every hostile input is built here, on a copy of one tiny trained run."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
from pathlib import Path

import pytest
from test_train_checkpoint import rewrite, xor_bytes
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
    assert not list(tmp_path.rglob(".*.forge-*"))


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


# --- nothing deleted that the user did not name ------------------------------------


def _siblings(run_dir: Path, out: Path) -> dict[Path, dict[str, bytes]]:
    """``out.old`` and ``out.partial``, each holding a whole run: names a user may choose."""
    for suffix in (".old", ".partial"):
        shutil.copytree(run_dir, out.with_name(out.name + suffix))
    return {p: run_files(p) for p in (out.with_name(out.name + ".old"), out.with_name(out.name + ".partial"))}


def _no_temporaries(folder: Path) -> bool:
    return not list(folder.glob(".*.forge-*"))


@pytest.mark.parametrize("overwrite", [False, True])
def test_export_and_prepare_leave_siblings_named_old_and_partial(trained, tmp_path, overwrite):
    run_dir, _ = copy_run(trained, tmp_path)
    flag = ["--overwrite"] if overwrite else []
    out = tmp_path / "out"
    siblings = _siblings(run_dir, out)
    if overwrite:  # an earlier export, replaced
        out.mkdir()
        (out / "stale.txt").write_text("earlier")
    result = forge_run(["export-hf", run_dir, out, *flag])
    assert result.code == 0, result.output
    assert (out / "config.json").is_file() and not (out / "stale.txt").exists()
    shards = tmp_path / "shards"
    siblings.update(_siblings(run_dir, shards))
    if overwrite:
        shards.mkdir()
    config = write_config(tmp_path / "p.yaml", tiny_config(tmp_path, "p"))
    result = forge_run(["prepare", config, "--out", shards, *flag])
    assert result.code == 0, result.output
    assert (shards / "index.json").is_file()
    for folder, files in siblings.items():
        assert run_files(folder) == files, folder
    assert _no_temporaries(tmp_path)


def test_a_crash_midway_through_an_export_leaves_out_and_every_folder(trained, tmp_path, monkeypatch):
    """A failure once the weights are written (here: writing the tokenizer) leaves the old
    export, the siblings and the run as they were, and no temporary."""
    import forge_core.cli.export as export

    run_dir, _ = copy_run(trained, tmp_path)
    out = tmp_path / "out"
    siblings = _siblings(run_dir, out)
    out.mkdir()
    (out / "earlier.txt").write_text("the export before")
    before = run_files(run_dir)

    def crash(tokenizer, saved, folder):
        assert (folder / "config.json").is_file()  # midway: the new weights are written
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "write_tokenizer", crash)
    result = forge_run(["export-hf", run_dir, out, "--overwrite"])
    assert result.code != 0, result.output
    assert run_files(out) == {"earlier.txt": b"the export before"}
    assert run_files(run_dir) == before
    for folder, files in siblings.items():
        assert run_files(folder) == files, folder
    assert _no_temporaries(tmp_path)


# --- resume: damaged checkpoints, pruning ------------------------------------------


def test_a_run_whose_checkpoints_are_all_damaged_refuses_to_start_over_them(trained, tmp_path):
    """Every ``.metadata`` damaged at the same size: exit 2 listing each checkpoint and
    the ways out, nothing trained or deleted; ``checkpoint.resume: never`` is one."""
    run_dir, config = copy_run(trained, tmp_path, steps=6)
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*"))
    assert len(checkpoints) == 2
    for checkpoint in checkpoints:
        xor_bytes(checkpoint / ".metadata", offset=20, count=8)
    before = run_files(run_dir)
    result = forge_run([config])
    assert result.code == 2, result.output
    err = result.stderr
    assert "holds checkpoints, but none of them can be loaded" in err and "Traceback" not in err
    for checkpoint in checkpoints:
        assert f"  - {checkpoint}: .metadata does not match its SHA-256" in err, err
    for way_out in ("checkpoint.resume: never", "another run.out_dir", "rm -r"):
        assert way_out in err
    assert run_files(run_dir) == before
    # The way out the message gives works: a new run from step 0.
    result = forge_run([config, "checkpoint.resume=never"])
    assert result.code == 0, result.output
    assert (run_dir / "checkpoints/latest").read_text().strip() == "step-000006"


def test_resuming_a_checkpoint_of_another_model_shape_is_refused_naming_the_shapes(trained, tmp_path):
    run_dir, config = copy_run(trained, tmp_path, steps=6)
    result = forge_run([config, "model.options.multiple_of=64"])
    assert result.code == 2, result.output
    assert "'layers.0.feed_forward.w1.weight' has shape [96, 32], the configured model's has [128, 32]" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_start_with_nothing_left_to_train_prunes_to_keep(trained, tmp_path):
    """What a run killed each time between moving ``latest`` and pruning leaves: more
    checkpoints than ``checkpoint.keep``. The next start prunes, even with nothing to train."""
    run_dir, config = copy_run(trained, tmp_path, steps=4)
    assert len(list((run_dir / "checkpoints").glob("step-*"))) == 2
    result = forge_run([config, "checkpoint.keep=1"])
    assert result.code == 0, result.output
    assert "nothing to do" in result.output
    assert [p.name for p in (run_dir / "checkpoints").glob("step-*")] == ["step-000004"]


# --- checkpoint files crafted to lie -----------------------------------------------


def lying_metadata(checkpoint: Path, how: str) -> bytes:
    """The checkpoint's own metadata with its storage offsets or a length changed."""
    with open(checkpoint / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # our own, just written
    entries = list(metadata.storage_data.values())
    if how == "offset+7":
        for info in entries:
            info.offset += 7
    else:
        entries[0].length = 10**15
    return pickle.dumps(metadata)


@pytest.mark.parametrize("how", ["offset+7", "length-1e15"])
def test_metadata_whose_offsets_or_lengths_lie_is_refused(trained, tmp_path, how):
    run_dir, config = copy_run(trained, tmp_path, steps=6)
    checkpoint = run_dir / "checkpoints/step-000004"
    rewrite(checkpoint, ".metadata", lying_metadata(checkpoint, how), manifest_too=True)
    for argv in (
        ["sample", run_dir, "--max-new-tokens", "2"],
        ["export-hf", run_dir, tmp_path / "hf"],
        [config],
    ):
        result = forge_run(argv)
        assert result.code == 2, (argv, result.output)
        assert f"refusing to load {checkpoint / '.metadata'}" in result.stderr, result.stderr
        assert "does not describe the files" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "checkpoints/step-000006").exists()


def test_a_train_state_nested_too_deep_is_refused_naming_the_file(trained, tmp_path):
    run_dir, config = copy_run(trained, tmp_path, steps=6)
    deep = '{"format": 1, "step": ' + "[" * 200_000 + "]" * 200_000 + "}"
    for checkpoint in (run_dir / "checkpoints").glob("step-*"):
        rewrite(checkpoint, "train_state-rank00000.json", deep.encode(), manifest_too=True)
    for argv in ([config], ["sample", run_dir, "--max-new-tokens", "2"]):
        result = forge_run(argv)
        assert result.code == 2, (argv, result.output)
        assert "train_state-rank00000.json" in result.stderr and "nested too deep" in result.stderr
        assert "Traceback" not in result.stderr


# --- one prepare per output --------------------------------------------------------


def test_a_second_prepare_on_one_output_is_refused_and_the_first_completes(tmp_path):
    """While one prepare holds ``D`` (its partial output being written), a second is
    refused naming it and touches nothing; the first's output is then complete."""
    from forge_core.cli.prepare import lock_output

    config = write_config(tmp_path / "p.yaml", tiny_config(tmp_path, "p"))
    out = tmp_path / "shards"
    first = lock_output(out)  # what the first prepare holds while it writes
    try:
        partial = tmp_path / "shards.partial"
        partial.mkdir()
        (partial / "tokens.bin").write_bytes(b"being written")
        second = forge_run(["prepare", config, "--out", out])
        assert second.code == 2, second.output
        assert "is being written by another `forge-run prepare`" in second.stderr
        assert f"pid {os.getpid()}" in second.stderr and "another --out" in second.stderr
        assert (partial / "tokens.bin").read_bytes() == b"being written" and not out.exists()
        shutil.rmtree(partial)
    finally:
        first.release()
    done = forge_run(["prepare", config, "--out", out])
    assert done.code == 0, done.output
    assert (out / "index.json").is_file() and not (tmp_path / "shards.lock").exists()


def test_prepare_overwrite_of_a_folder_holding_a_run_is_refused(trained, tmp_path):
    run_dir, _ = copy_run(trained, tmp_path)
    before = run_files(run_dir)
    config = write_config(tmp_path / "p.yaml", tiny_config(tmp_path, "p"))
    result = forge_run(["prepare", config, "--out", run_dir, "--overwrite"])
    assert result.code == 2, result.output
    assert "holds a Forge run or checkpoint" in result.stderr and "another --out" in result.stderr
    assert run_files(run_dir) == before


# --- a tracker that cannot be reached ----------------------------------------------


@pytest.fixture
def silent_server():
    """A loopback address that accepts connections and never answers (a hung server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


def closed_port() -> str:
    """A loopback address where nothing listens (connections are refused)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}"


def tracker_config(tmp_path: Path, logger: str, options: dict) -> str:
    cfg = tiny_config(
        tmp_path,
        "tracked",
        train={"steps": 3},
        logging={"loggers": ["jsonl", logger], "options": {logger: options}},
    )
    return write_config(tmp_path / "tracked.yaml", cfg)


def test_an_mlflow_server_that_does_not_answer_stops_the_run_within_its_timeout(tmp_path, silent_server):
    """MLflow's defaults (120 s a request, 7 retries) kept this silent for about five
    minutes; each request now has ``timeout`` seconds and no retry, and the message says so."""
    result = forge_run([tracker_config(tmp_path, "mlflow", {"tracking_uri": silent_server, "timeout": 1})])
    assert result.code == 2, result.output
    err = result.stderr
    assert f"the mlflow logger could not start an MLflow run at {silent_server}" in err
    assert "each request had 1 s, connecting included, and no retry" in err and "unreachable: warn" in err
    assert not (tmp_path / "tracked/checkpoints").exists()  # not one step was taken
    assert os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES") is None  # the bound was for the start only


def test_with_unreachable_warn_training_goes_on_without_the_tracker(tmp_path):
    uri = closed_port()
    result = forge_run(
        [tracker_config(tmp_path, "mlflow", {"tracking_uri": uri, "timeout": 1, "unreachable": "warn"})]
    )
    assert result.code == 0, result.output
    assert f"warning: the mlflow logger could not start an MLflow run at {uri}" in result.stderr
    assert "training goes on without it" in result.stderr
    assert len((tmp_path / "tracked/metrics.jsonl").read_text().splitlines()) == 3
    assert not (tmp_path / "tracked/mlflow-run.json").exists()


def test_wandb_start_is_bounded_by_its_timeout_and_may_warn(tmp_path, monkeypatch):
    """wandb.init gets ``init_timeout`` (its default, 90 s, hid a refused server); what it
    raises then is a warning with ``unreachable: warn``."""
    wandb = pytest.importorskip("wandb")
    seen = {}

    def unreachable(**kwargs):
        seen.update(kwargs)
        raise wandb.errors.CommError("Timed out while retrying: connection refused")

    monkeypatch.setattr(wandb, "init", unreachable)
    result = forge_run([tracker_config(tmp_path, "wandb", {"timeout": 2, "unreachable": "warn"})])
    assert result.code == 0, result.output
    assert seen["settings"].init_timeout == 2
    assert "warning: the wandb logger could not start a W&B run: CommError" in result.stderr
    assert "(it had 2 s: logging.options.wandb.timeout)" in result.stderr
    assert len((tmp_path / "tracked/metrics.jsonl").read_text().splitlines()) == 3
