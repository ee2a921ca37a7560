"""The ``jsonl`` logger: one JSON object per logged step in ``<run>/metrics.jsonl``.

Every line is ``{"step": N, "loss": ..., "lr": ..., ...}`` with non-finite numbers
written as ``null`` (strict JSON). A resumed run first drops the lines of steps after
the checkpoint it resumed from (a crashed run may have logged steps it then lost), so
the file always describes one continuous run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from forge_core.hookspecs import hookimpl


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line (killed mid-write) is ignored."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


class JsonlLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.file = None

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        path = Path(run.out_dir) / self.options.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(path) if r["step"] <= run.start_step] if run.start_step else []
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, path)
        self.file = open(path, "a", encoding="utf-8")

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.file is None or not run.should_log(step):
            return
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.file is not None:
            self.file.close()
            self.file = None
