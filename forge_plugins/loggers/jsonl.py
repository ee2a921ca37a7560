"""The ``jsonl`` logger: one JSON object per logged step in ``<run>/metrics.jsonl``.

Every line is ``{"step": N, "loss": ..., "lr": ..., ...}`` with non-finite numbers
written as ``null`` (strict JSON). The file is only ever appended to and cut short,
never replaced: a resumed run first cuts off the lines of steps after the checkpoint it
resumed from (a crashed run may have logged steps it then lost, or a torn last line),
so the file always describes one continuous run. A fresh run starts it empty. The run
directory's lock keeps a second run from writing the same file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError, hookimpl


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


def _kept_bytes(path: Path, last_step: int) -> int:
    """Length of the file's leading whole lines that are records of steps up to
    ``last_step``: what a run resumed at ``last_step`` keeps."""
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    kept = 0
    for line in data.splitlines(keepends=True):
        try:
            record = json.loads(line)
        except ValueError:
            break
        if not (
            line.endswith(b"\n")
            and isinstance(record, dict)
            and isinstance(record.get("step"), int)
            and record["step"] <= last_step
        ):
            break
        kept += len(line)
    return kept


def _write_failed(path: Path, exc: OSError) -> ForgeError:
    return ForgeError(
        f"the jsonl logger cannot write {path}: {exc.strerror or exc}. Free some space or fix "
        f"the directory's permissions (or drop 'jsonl' from logging.loggers) and run again; "
        f"the run resumes from its latest checkpoint."
    )


class JsonlLogger:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.path: Path | None = None
        self.file = None

    @hookimpl
    def forge_train_start(self, run):
        if not run.is_main:
            return
        self.path = path = Path(run.out_dir) / self.options.filename
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            keep = _kept_bytes(path, run.start_step) if run.start_step else 0
            self.file = open(path, "a", encoding="utf-8")
            self.file.truncate(keep)
        except OSError as exc:
            raise _write_failed(path, exc) from None

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if self.file is None or not run.should_log(step):
            return
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as exc:
            raise _write_failed(self.path, exc) from None

    @hookimpl
    def forge_train_end(self, run, step, status):
        if self.file is not None:
            file, self.file = self.file, None
            try:
                file.close()
            except OSError:  # a flush on a full disk: the step lines were flushed already
                pass
