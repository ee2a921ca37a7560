"""The ``wandb`` logger: the run in Weights & Biases.

On the main process: the resolved config as the W&B run's config, every numeric metric
of every logged step (names as in :mod:`forge_plugins.loggers.tracking`), and when the
run ends the loss curve as an artifact (``loss-plot``, type ``plot``). The W&B files go
under ``<run>/wandb``; the W&B run id is kept in ``<run>/wandb-run.json`` so that a
resumed run continues the same W&B run (``resume="allow"``). ``mode: offline`` (or
``WANDB_MODE=offline``) needs no account and no network: ``wandb sync <run>/wandb``
uploads later.

Needs the ``wandb`` package (``pip install 'forge-trainer[wandb]'``); without it the run
goes on and a warning says so. A W&B run that cannot start (not logged in, no network:
known within ``timeout`` seconds, wandb's ``init_timeout``) stops the run before its
first step with the reason and what to do (``unreachable: stop``, the default), or
training goes on without this logger after a warning (``unreachable: warn``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge_core.api import hookimpl
from forge_plugins.loggers.tracking import (
    LossCurve,
    cannot_start,
    missing,
    numeric_metrics,
    plain_config,
    read_run_id,
    write_run_id,
)

RUN_ID_FILE = "wandb-run.json"
_EXIT_CODES = {"completed": 0, "interrupted": 0, "failed": 1}


class WandbLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.run = None
        self.curve = LossCurve()

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        try:
            import wandb
        except ImportError:
            missing("wandb")
            return
        o = self.options
        out = Path(run.out_dir)
        stored = read_run_id(out / RUN_ID_FILE)
        kwargs: dict[str, Any] = {
            "project": o.project or run.config.run.name,
            "name": o.name or run.config.run.name,
            "dir": str(out),
            "config": plain_config(run.config),
            "allow_val_change": True,
            "resume": "allow",
            "id": stored["run_id"] if stored else None,
        }
        for key in ("entity", "group", "mode"):
            if getattr(o, key):
                kwargs[key] = getattr(o, key)
        if o.tags:
            kwargs["tags"] = list(o.tags)
        kwargs["settings"] = wandb.Settings(init_timeout=o.timeout)
        try:
            self.run = wandb.init(**kwargs)
        except Exception as exc:  # noqa: BLE001 - W&B raises many kinds; all mean the same here
            self.run = None
            cannot_start(
                "wandb",
                o,
                "a W&B run",
                f"{type(exc).__name__}: {str(exc)[:500]} "
                f"(it had {o.timeout} s: logging.options.wandb.timeout)",
                f"Log in (`wandb login`, or set WANDB_API_KEY), or set logging.options.wandb.mode: offline "
                f"(no network; `wandb sync {out / 'wandb'}` uploads later)",
            )
            return
        write_run_id(out / RUN_ID_FILE, {"run_id": self.run.id, "project": self.run.project})
        self.curve.start(run)
        print(
            f"forge: wandb run {self.run.id} ({'resumed' if stored else 'new'}"
            f"{', offline' if self.run.offline else ''}) in {out / 'wandb'}",
            flush=True,
        )

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.run is None:
            return
        self.curve.add(step, metrics)
        if run.should_log(step):
            self.run.log(numeric_metrics(metrics), step=step)

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.run is None:
            return
        wrun, self.run = self.run, None
        try:
            import wandb

            with self.curve.png(f"{run.config.run.name}: training loss") as png:
                if png is not None:
                    artifact = wandb.Artifact(
                        "loss-plot",
                        type="plot",
                        metadata={"steps": len(self.curve.points), "last_step": step},
                    )
                    artifact.add_file(str(png), name="loss.png")
                    wrun.log_artifact(artifact)
        finally:
            wrun.finish(exit_code=_EXIT_CODES.get(status, 1))
