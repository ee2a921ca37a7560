"""Checkpoints that survive a kill at any moment.

Layout of ``<run>/checkpoints``::

    step-000200/            a complete checkpoint
        .metadata, *.distcp    model and optimizer (torch.distributed.checkpoint)
        train_state-rank00000.json   step, RNG states, loader position (one per process)
        manifest.json          written last: every file with its size
    .tmp-step-000300/       a checkpoint being written (ignored, removed later)
    latest                  the name of the newest complete checkpoint

A save writes into ``.tmp-step-N``, writes the manifest, renames the directory to
``step-N``, and only then moves ``latest`` (temp file + ``os.replace``). A checkpoint is
*complete* when its manifest exists and every file it lists has the listed size; resume
takes ``latest`` when complete, otherwise the newest complete one, warning about each
one skipped. Model and optimizer state go through ``get_state_dict``/``set_state_dict``
so the same code serves a single process, DDP, FSDP and TP.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from forge_core.train import train_state
from forge_core.train.distributed import barrier, broadcast_object, is_distributed

MANIFEST = "manifest.json"
LATEST = "latest"
STEP_RE = re.compile(r"^step-(\d{6,})$")
#: Test hook: ``SECONDS`` (every save) or ``STEP:SECONDS`` (the save of that step only)
#: to pause in the middle of a checkpoint write (files written, manifest not yet),
#: after printing a marker line, so a test can kill the process there.
SLOW_ENV = "FORGE_TEST_SLOW_CHECKPOINT"


def _test_pause(step: int) -> float:
    value = os.environ.get(SLOW_ENV, "").strip()
    if not value:
        return 0.0
    at, sep, seconds = value.rpartition(":")
    if sep and int(at) != step:
        return 0.0
    return float(seconds)

_OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _dcp(fn: Any, state: dict[str, Any], path: Path) -> None:
    """``dcp.save``/``dcp.load``, without a process group in a single process (and
    without its warning that it assumes so)."""
    no_dist = not is_distributed()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        fn(state, checkpoint_id=str(path), no_dist=no_dist)


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def train_state_name(rank: int) -> str:
    return f"train_state-rank{rank:05d}.json"


# --- model and optimizer state ------------------------------------------------------


def model_state(parts: list[torch.nn.Module]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(get_model_state_dict(part))
    return merged


def optimizer_state(parts: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part, optimizer in zip(parts, optimizers, strict=True):
        merged.update(get_optimizer_state_dict(part, optimizer, options=_OPTIM_OPTIONS))
    return merged


def _set_model(parts: list[torch.nn.Module], merged: dict[str, Any]) -> None:
    """Load a merged model state into every part (each takes its own keys)."""
    strict = StateDictOptions(strict=len(parts) == 1)
    for part in parts:
        set_model_state_dict(part, merged, options=strict)


def load_model(path: Path, parts: list[torch.nn.Module]) -> None:
    """Load only the model weights of a checkpoint into ``parts``."""
    state = {"model": model_state(parts)}
    _dcp(dcp.load, state, path)
    _set_model(parts, state["model"])


# --- completeness -------------------------------------------------------------------


def problem_with(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, or ``None`` when it is."""
    if not path.is_dir():
        return "the directory does not exist"
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is missing or unreadable (the write did not finish)"
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {size} (truncated?)"
    return None


def step_of(path: Path) -> int:
    match = STEP_RE.match(path.name)
    return int(match.group(1)) if match else -1


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_RE.match(p.name) and problem_with(p) is None]
    return sorted(found, key=step_of)


def find_latest(root: Path, warn: Any = None) -> Path | None:
    """The checkpoint to resume from: ``latest`` when complete, else the newest complete
    one. ``warn(message)`` is told about every checkpoint skipped."""
    warn = warn or (lambda message: None)
    pointer = root / LATEST
    skipped = None
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        candidate = root / name
        why = problem_with(candidate) if STEP_RE.match(name) else f"{name!r} is not a checkpoint name"
        if why is None:
            return candidate
        warn(f"skipping checkpoint {candidate}: {why}; falling back to the newest complete one")
        skipped = candidate
    if not root.is_dir():
        return None
    for path in sorted((p for p in root.iterdir() if STEP_RE.match(p.name)), key=step_of, reverse=True):
        if path == skipped:
            continue
        why = problem_with(path)
        if why is None:
            return path
        warn(f"skipping checkpoint {path}: {why}")
    return None


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(checkpoint dir, run dir)`` for a run directory, its ``checkpoints`` directory or
    one checkpoint directory."""
    from forge_core.errors import ForgeError

    path = Path(path)
    if (path / MANIFEST).is_file():
        why = problem_with(path)
        if why:
            raise ForgeError(f"checkpoint {path} is incomplete: {why}")
        return path, path.parent.parent
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    messages: list[str] = []
    found = find_latest(root, messages.append)
    for message in messages:
        print(f"warning: {message}", file=sys.stderr)
    if found is None:
        raise ForgeError(
            f"no complete checkpoint under {path}. Give a run directory (the run's out_dir) or a "
            f"checkpoint directory (…/checkpoints/step-000100); a run saves one at the end, every "
            f"checkpoint.every steps and on SIGTERM/SIGINT."
        )
    return found, root.parent


# --- save and load ------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a reader sees the old or the new file, never a
    torn one, and the new one survives a crash once this returns."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class CheckpointManager:
    """Saves and finds checkpoints of one run. Every process calls ``save`` and
    ``load``; directory bookkeeping happens on rank 0 between barriers."""

    def __init__(self, run_dir: str | Path, keep: int, rank: int, world_size: int) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.rank = rank
        self.world_size = world_size

    def save(self, step: int, parts: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer],
             state: dict[str, Any]) -> Path:
        final = self.root / step_name(step)
        tmp = self.root / f".tmp-{step_name(step)}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        barrier()
        _dcp(dcp.save, {"model": model_state(parts), "optim": optimizer_state(parts, optimizers)}, tmp)
        train_state.write(tmp / train_state_name(self.rank), {**state, "world_size": self.world_size})
        slow = _test_pause(step)
        if slow > 0 and self.rank == 0:
            print(f"forge-test: checkpoint write in progress at step {step}", flush=True)
            time.sleep(slow)
        barrier()
        if self.rank == 0:
            files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
            atomic_write(tmp / MANIFEST, json.dumps({"step": step, "world_size": self.world_size,
                                                     "files": files}, indent=1))
            if final.exists():  # an older write of the same step: the new one replaces it
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            atomic_write(self.root / LATEST, final.name + "\n")
            self._prune(final)
        barrier()
        return final

    def _prune(self, newest: Path) -> None:
        complete = complete_checkpoints(self.root)
        for old in complete[: max(0, len(complete) - self.keep)]:
            if old != newest:
                shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)

    def find_resume(self, warn: Any) -> Path | None:
        """Rank 0 picks the checkpoint; every process gets the same answer."""
        found = find_latest(self.root, warn) if self.rank == 0 else None
        found = broadcast_object(None if found is None else str(found))
        return None if found is None else Path(found)

    def load(self, path: Path, parts: list[torch.nn.Module],
             optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
        from forge_core.errors import ForgeError

        state_file = path / train_state_name(self.rank)
        try:
            state = train_state.read(state_file)
        except (OSError, ValueError) as exc:
            raise ForgeError(f"cannot read {state_file}: {exc}") from None
        if state.get("world_size") != self.world_size:
            raise ForgeError(
                f"checkpoint {path} was written by {state.get('world_size')} processes; this run has "
                f"{self.world_size}. Exact resume needs the same number of processes (the loader "
                f"position and RNG states are per process). Relaunch with that many, or start a new "
                f"run (checkpoint.resume: never, or another run.out_dir)."
            )
        full = {"model": model_state(parts), "optim": optimizer_state(parts, optimizers)}
        _dcp(dcp.load, full, path)
        _set_model(parts, full["model"])
        for part, optimizer in zip(parts, optimizers, strict=True):
            set_optimizer_state_dict(part, optimizer, full["optim"], options=_OPTIM_OPTIONS)
        return state
