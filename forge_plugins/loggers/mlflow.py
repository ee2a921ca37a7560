"""The ``mlflow`` logger: the run in MLflow tracking.

On the main process: the resolved config as parameters (``train.lr`` ...) and as the
artifact ``config.yaml``, every numeric metric of every logged step (names as in
:mod:`forge_plugins.loggers.tracking`, with each character MLflow refuses in a metric
name, such as the ``#`` of a source label ``text#1``, written as ``_``), and when the
run ends the loss curve as the artifact ``loss.png``, with the run's status
(``FINISHED``, ``KILLED`` when interrupted, ``FAILED``). The MLflow run id is kept in
``<run>/mlflow-run.json`` so that a resumed run continues the same MLflow run.

Where it goes: ``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else a local store in the
run directory (``sqlite:///<run>/mlflow/mlflow.db``, artifacts in
``<run>/mlflow/artifacts``; browse it with ``mlflow ui --backend-store-uri`` and that
URI). MLflow keeps the first value of a parameter: a setting changed on resume is
warned about and recorded in ``config.yaml`` artifacts (one per start), not as a
parameter.

Needs MLflow (``pip install 'forge-trainer[mlflow]'``: the ``mlflow-skinny`` client and
the SQL store's libraries; the full ``mlflow`` package works too); without it the run
goes on and a warning says so. A tracking server that cannot be reached is known within
``timeout`` seconds (each request at the start, connecting included, without MLflow's
retries); then, as ``unreachable`` says, the run stops before its first step with the
reason (``stop``, the default) or goes on without this logger after a warning (``warn``).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from forge_core.api import ForgeError, hookimpl
from forge_core.api.unstable import environment
from forge_plugins.loggers.tracking import (
    LossCurve,
    cannot_start,
    flat_config,
    missing,
    numeric_metrics,
    plain_config,
    read_run_id,
    write_run_id,
)

RUN_ID_FILE = "mlflow-run.json"
LOCAL_DIR = "mlflow"
_STATUS = {"completed": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}
#: MLflow accepts at most this many parameters or metrics in one ``log_batch``.
_BATCH = 100
#: What MLflow refuses in a metric name (it accepts word characters, ``/ . - :`` and spaces).
_REFUSED = re.compile(r"[^\w/.\- :]")
#: Longest parameter value MLflow stores.
_MAX_VALUE = 6000


def local_store(run_dir: Path) -> tuple[str, str]:
    """``(tracking URI, artifact location)`` of the store kept in the run directory."""
    root = (run_dir / LOCAL_DIR).resolve()
    return f"sqlite:///{root / 'mlflow.db'}", (root / "artifacts").as_uri()


class MlflowLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.client = None
        self.run_id: str | None = None
        self.curve = LossCurve()

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            missing("mlflow")
            return
        out = Path(run.out_dir)
        uri = self.options.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        artifacts = None
        if not uri:
            uri, artifacts = local_store(out)
            (out / LOCAL_DIR).mkdir(parents=True, exist_ok=True)
        timeout = self.options.timeout
        try:
            with bounded_requests(timeout):
                self._open(MlflowClient(uri), run, artifacts, read_run_id(out / RUN_ID_FILE), uri)
        except ForgeError:
            raise
        except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds; all mean the same here
            self.client = None
            bound = (
                f" (each request had {timeout} s, connecting included, and no retry: "
                f"logging.options.mlflow.timeout)"
                if uri.startswith(("http://", "https://"))
                else ""
            )
            cannot_start(
                "mlflow",
                self.options,
                f"an MLflow run at {uri}",
                f"{type(exc).__name__}: {str(exc)[:500]}{bound}",
                "Check logging.options.mlflow.tracking_uri (or MLFLOW_TRACKING_URI)",
            )
            return
        write_run_id(out / RUN_ID_FILE, {"run_id": self.run_id, "tracking_uri": uri})
        self.curve.start(run)

    def _open(self, client: Any, run: Any, artifacts: str | None, stored: dict | None, uri: str) -> None:
        from mlflow.entities import Param

        name = self.options.experiment or run.config.run.name
        existing = None
        if stored and stored.get("tracking_uri") == uri:
            try:
                existing = client.get_run(stored["run_id"])
            except Exception:  # noqa: BLE001 - deleted or another store: start a new one
                print(
                    f"warning: MLflow run {stored['run_id']} is not in {uri}; starting a new one",
                    file=sys.stderr,
                    flush=True,
                )
        if existing is not None:
            self.run_id = existing.info.run_id
            client.update_run(self.run_id, status="RUNNING")
            logged = existing.data.params
        else:
            experiment = client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else client.create_experiment(name, artifact_location=artifacts)
            )
            self.run_id = client.create_run(
                experiment_id,
                run_name=self.options.run_name or run.config.run.name,
                tags=dict(self.options.tags),
            ).info.run_id
            logged = {}
        self.client = client
        params = {k: str(v)[:_MAX_VALUE] for k, v in flat_config(run.config).items()}
        changed = sorted(k for k in params if k in logged and logged[k] != params[k])
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), _BATCH):
            client.log_batch(self.run_id, params=new[i : i + _BATCH])
        with tempfile.TemporaryDirectory(prefix="forge-mlflow-") as tmp:
            path = Path(tmp) / f"config-step{run.start_step}.yaml"
            path.write_text(yaml.safe_dump(plain_config(run.config), sort_keys=False), encoding="utf-8")
            client.log_artifact(self.run_id, str(path), artifact_path="config")
        print(f"forge: mlflow run {self.run_id} ({'resumed' if existing else 'new'}) at {uri}", flush=True)
        if changed:
            print(
                f"warning: MLflow keeps a parameter's first value; changed since the run started: "
                f"{', '.join(changed[:8])}{' ...' if len(changed) > 8 else ''} (the new values are in the "
                f"artifact config/config-step{run.start_step}.yaml)",
                file=sys.stderr,
                flush=True,
            )

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.client is None:
            return
        self.curve.add(step, metrics)
        if not run.should_log(step):
            return
        from mlflow.entities import Metric

        now = _millis()
        batch = [Metric(metric_name(k), v, now, step) for k, v in numeric_metrics(metrics).items()]
        for i in range(0, len(batch), _BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + _BATCH])

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.client is None:
            return
        client, self.client = self.client, None
        try:
            with self.curve.png(f"{run.config.run.name}: training loss") as png:
                if png is not None:
                    client.log_artifact(self.run_id, str(png))
        finally:
            client.set_terminated(self.run_id, status=_STATUS.get(status, "FAILED"))


@contextmanager
def bounded_requests(timeout: int) -> Iterator[None]:
    """MLflow's HTTP requests while the run starts: ``timeout`` seconds each (connecting
    included) and no retries. MLflow's defaults (120 s, 7 retries with backoff) keep an
    unreachable server silent for about five minutes; MLflow reads these settings from
    the environment at every request, so they are set only for the start."""
    bounds = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    with environment(bounds):
        yield


def metric_name(name: str) -> str:
    """``name`` as MLflow accepts it: a refused character becomes ``_``."""
    return _REFUSED.sub("_", name)


def _millis() -> int:
    import time

    return int(time.time() * 1000)
