"""The experiment-tracker loggers, offline, read back: TensorBoard (event files), Weights
& Biases (offline mode, the run's ``.wandb`` log) and MLflow (the SQLite store in the run
directory). Each gets the config as hyperparameters, every numeric metric under its
name (``eval/*`` keys unchanged), the loss plot as an artifact, and continues the same
tracked run on resume. A missing package is a warning naming the extra."""

from __future__ import annotations

import builtins
import json
import struct
from pathlib import Path

import pytest
from train_helpers import Recorder, tiny_config, write_config

from forge_core.api import hookimpl
from forge_core.testing import train_in_process


class EvalMetrics:
    """Stands in for the evaluation loop: adds ``eval/*`` keys to the metrics every
    logger gets, one of them named after a source label MLflow would refuse (``text#1``)."""

    @hookimpl
    def forge_step_metrics(self, step):
        if step % 2 == 0:
            return {"eval/loss": 10.0 + step, "eval/text#1/loss": 20.0 + step}
        return None


def run(
    tmp_path: Path,
    name: str,
    logger: str,
    steps: int,
    options: dict | None = None,
    every: int = 1,
    overrides=(),
) -> Recorder:
    rec = Recorder()
    cfg = tiny_config(
        tmp_path,
        name,
        train={"steps": steps},
        logging={"loggers": [logger], "every": every, "options": {logger: options or {}}},
    )
    path = write_config(tmp_path / f"{name}.yaml", cfg)
    assert (
        train_in_process(path, list(overrides), extra_plugins=(("eval", EvalMetrics()), ("rec", rec)))
        == "completed"
    )
    return rec


def losses(rec: Recorder, steps) -> dict[int, float]:
    return {s: rec.metrics[s]["loss"] for s in steps}


# --- TensorBoard ----------------------------------------------------------------------


def tensorboard_events(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_scalars_hparams_and_resume(tmp_path):
    first = run(tmp_path, "tb", "tensorboard", 4)
    second = run(tmp_path, "tb", "tensorboard", 6, overrides=["train.steps=6"])
    acc = tensorboard_events(tmp_path / "tb/tensorboard")
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/grad_norm", "train/mem_rss_peak_gib", "eval/loss"} <= set(tags)
    got = {e.step: e.value for e in acc.Scalars("train/loss")}
    want = {**losses(first, range(1, 5)), **losses(second, range(5, 7))}
    assert got == pytest.approx(want, rel=1e-6)  # stored as float32
    assert {e.step: e.value for e in acc.Scalars("eval/loss")} == {2: 12.0, 4: 14.0, 6: 16.0}

    from tensorboard.plugins.hparams import plugin_data_pb2

    contents = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"])
    hp = session.session_start_info.hparams
    assert hp["train.steps"].number_value == 4  # as the run started
    assert hp["model.name"].string_value == "llama" and hp["train.lr"].number_value == pytest.approx(3e-3)
    assert hp["data.source_options.paths"].string_value.startswith('["')
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("config/text_summary")}
    assert sorted(texts) == [0, 4]
    assert "steps: 4" in texts[0] and "steps: 6" in texts[4]  # every start's config, as text


# --- Weights & Biases -------------------------------------------------------------------


def wandb_records(path: Path):
    """Every record of a ``.wandb`` transaction log: a LevelDB-style log of 32 KiB
    blocks after a 7-byte header, each record a protobuf ``Record``, split across
    blocks as FIRST/MIDDLE/LAST chunks (7-byte chunk headers: crc32, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, block, buffered = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # padding up to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buffered = chunk if kind in (1, 2) else buffered + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buffered)
            yield record


def wandb_logged(run_dir: Path) -> dict:
    """What the W&B runs under ``run_dir/wandb`` logged: run ids, config, history, artifacts."""
    out: dict = {"ids": [], "config": {}, "history": {}, "artifacts": []}
    for log in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                out["ids"].append(record.run.run_id)
                out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "config":
                out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "history":
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item
                }
                out["history"][record.history.step.num] = items
            elif kind == "artifact":
                out["artifacts"].append(
                    (
                        record.artifact.name,
                        record.artifact.type,
                        [c.path for c in record.artifact.manifest.contents],
                    )
                )
    return out


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    for var, sub in (
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_CONFIG_DIR", "config"),
    ):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def test_wandb_offline_logs_config_metrics_plot_and_resumes_the_same_run(tmp_path, wandb_offline):
    first = run(tmp_path, "wb", "wandb", 4, {"tags": ["smoke"]})
    stored = json.loads((tmp_path / "wb/wandb-run.json").read_text())
    second = run(tmp_path, "wb", "wandb", 6, overrides=["train.steps=6"])
    got = wandb_logged(tmp_path / "wb")
    assert got["ids"] == [stored["run_id"]] * 2  # the resumed run is the same W&B run
    assert json.loads((tmp_path / "wb/wandb-run.json").read_text())["run_id"] == stored["run_id"]
    assert got["config"]["train"]["steps"] == 6 and got["config"]["model"]["name"] == "llama"
    assert sorted(got["history"]) == [1, 2, 3, 4, 5, 6]
    want = {**losses(first, range(1, 5)), **losses(second, range(5, 7))}
    assert {s: h["train/loss"] for s, h in got["history"].items()} == want  # JSON: exact
    assert got["history"][4]["eval/loss"] == 14.0 and "eval/loss" not in got["history"][3]
    assert got["history"][1]["train/skipped"] == 0 and got["history"][1]["train/mem_rss_peak_gib_max"] > 0
    assert got["artifacts"] == [("loss-plot", "plot", ["loss.png"])] * 2


def test_wandb_logs_only_logged_steps(tmp_path, wandb_offline):
    run(tmp_path, "every", "wandb", 5, every=2)
    assert sorted(wandb_logged(tmp_path / "every")["history"]) == [2, 4, 5]


# --- MLflow -----------------------------------------------------------------------------


def test_mlflow_local_store_logs_params_metrics_plot_and_resumes_the_same_run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = run(tmp_path, "ml", "mlflow", 4, {"tags": {"team": "forge"}})
    stored = json.loads((tmp_path / "ml/mlflow-run.json").read_text())
    second = run(tmp_path, "ml", "mlflow", 6, overrides=["train.steps=6"])
    assert "MLflow keeps a parameter's first value; changed since the run started: train.steps" in (
        capsys.readouterr().err
    )

    from mlflow.tracking import MlflowClient

    from forge_plugins.loggers.mlflow import local_store

    uri, _ = local_store(tmp_path / "ml")
    assert stored["tracking_uri"] == uri
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("ml").experiment_id])
    assert [r.info.run_id for r in runs] == [stored["run_id"]]  # one run, continued
    mlrun = client.get_run(stored["run_id"])
    assert mlrun.info.status == "FINISHED" and mlrun.data.tags["team"] == "forge"
    assert mlrun.data.params["train.steps"] == "4"  # MLflow keeps the first value
    assert mlrun.data.params["model.name"] == "llama" and mlrun.data.params["train.lr"] == "0.003"
    history = {m.step: m.value for m in client.get_metric_history(stored["run_id"], "train/loss")}
    assert history == {**losses(first, range(1, 5)), **losses(second, range(5, 7))}
    assert {m.step: m.value for m in client.get_metric_history(stored["run_id"], "eval/loss")} == {
        2: 12.0,
        4: 14.0,
        6: 16.0,
    }
    # MLflow refuses '#' in a metric name: the logger writes it as '_' instead of failing the run.
    refused = client.get_metric_history(stored["run_id"], "eval/text_1/loss")
    assert {m.step: m.value for m in refused} == {2: 22.0, 4: 24.0, 6: 26.0}
    artifacts = {a.path for a in client.list_artifacts(stored["run_id"])}
    assert artifacts == {"loss.png", "config"}
    configs = {a.path for a in client.list_artifacts(stored["run_id"], "config")}
    assert configs == {"config/config-step0.yaml", "config/config-step4.yaml"}
    assert str((tmp_path / "ml/mlflow").resolve()) in mlrun.info.artifact_uri  # nothing outside the run


def test_mlflow_unreachable_store_is_a_clear_error(tmp_path, capsys):
    from forge_core import cli

    cfg = tiny_config(
        tmp_path,
        "bad",
        logging={"loggers": ["mlflow"], "options": {"mlflow": {"tracking_uri": "nosuch://x"}}},
    )
    assert cli.main(["train", write_config(tmp_path / "bad.yaml", cfg)]) == 2
    err = capsys.readouterr().err
    assert "the mlflow logger could not start an MLflow run at nosuch://x" in err
    assert "logging.options.mlflow.tracking_uri" in err


# --- missing packages -------------------------------------------------------------------


@pytest.mark.parametrize(
    "logger, module, extra",
    [
        ("tensorboard", "torch.utils.tensorboard", "tensorboard"),
        ("wandb", "wandb", "wandb"),
        ("mlflow", "mlflow.tracking", "mlflow"),
    ],
)
def test_missing_package_is_a_warning_naming_the_extra(tmp_path, monkeypatch, capsys, logger, module, extra):
    real = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)
    run(tmp_path, f"no-{logger}", logger, 2)
    err = capsys.readouterr().err
    assert f"the {logger} logger needs" in err and f"pip install 'forge-trainer[{extra}]'" in err


def test_wandb_that_cannot_start_stops_the_run_before_its_first_step(tmp_path, monkeypatch, capsys):
    import wandb

    from forge_core import cli

    def refuse(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    cfg = tiny_config(tmp_path, "nologin", logging={"loggers": ["wandb", "jsonl"]})
    assert cli.main(["train", write_config(tmp_path / "nologin.yaml", cfg)]) == 2
    err = capsys.readouterr().err
    assert "the wandb logger could not start a W&B run: UsageError: api_key not configured" in err
    assert "logging.options.wandb.mode: offline" in err
    assert not (tmp_path / "nologin/checkpoints").exists()  # not one step was taken
