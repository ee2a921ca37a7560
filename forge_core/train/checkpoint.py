"""Checkpoints that survive a kill at any moment, and that are checked before they are
trusted.

Layout of ``<run>/checkpoints``::

    step-000200/            a complete checkpoint
        .metadata, *.distcp    model and optimizer (torch.distributed.checkpoint)
        train_state-rank00000.json   step, RNG states, loader position (one per process)
        ...                    files plugins add (the ``forge_checkpoint_writing`` hook)
        manifest.json          written last: every file with its size and SHA-256
    .tmp-step-000300/       a checkpoint being written (ignored, removed later)
    latest                  the name of the newest complete checkpoint

A save writes into ``.tmp-step-N`` (then lets plugins add files of their own there),
flushes every file to disk, hashes them into the manifest, renames the directory to
``step-N``, and only then moves ``latest`` (:func:`~forge_core.api.files.atomic_write`).
With ``checkpoint.async: true`` the model and optimizer files are written in the
background and the rest follows when they are on disk
(:mod:`forge_core.train.checkpoint_async`); at most one save is in flight.

A checkpoint is *complete* (:func:`problem_with` says nothing) when its manifest lists
every file with its size and SHA-256 and the files match, its ``.metadata`` parses as
DCP metadata and every train state as JSON. Resume takes ``latest`` when complete,
otherwise the newest complete one, warning about each one skipped: a damaged newest
checkpoint costs the steps since the previous one, never a traceback. A checkpoint
written before checksums were recorded is accepted with a warning (sizes checked
only). A file made to run code when loaded is refused outright
(:class:`~forge_core.train.checkpoint_reader.UnsafeCheckpoint`), not skipped: nothing
from it is executed, see :mod:`forge_core.train.checkpoint_reader`.

Resume refuses a run directory holding checkpoints none of which can be loaded
(:func:`no_usable_checkpoint`) rather than training from step 0 over them.

Pruning keeps ``checkpoint.keep`` checkpoints counting only those known intact (saved
or resumed by this process, or verified when pruning needs them), so the last
checkpoint that verified is never deleted in favour of a damaged one. It runs after
every save and after a resume, so a run killed between moving ``latest`` and pruning
(or restarted with nothing left to train) leaves no more than ``keep``.

A full disk during a save is reported as such (:class:`ForgeError`, exit 2): the partial
write is removed and the previous checkpoint stays as it was. Model and optimizer state
go through ``get_state_dict``/``set_state_dict`` so the same code serves a single
process, DDP, FSDP and TP.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from forge_core.api import ForgeError
from forge_core.api.files import ATOMIC_TMP_RE, atomic_write, fsync_dir, sync_tree
from forge_core.api.transforms import saves_trainable_only
from forge_core.distributed.parallelize import materialize
from forge_core.distributed.placement import broadcast_object, is_distributed
from forge_core.train import elastic, train_state

if TYPE_CHECKING:
    from forge_core.train import checkpoint_async

# torch.distributed.checkpoint (and this package's modules built on it:
# checkpoint_async, checkpoint_reader) is imported where a checkpoint is written or
# read, not with this module: importing it takes about a second of CPU (it brings
# DTensor and sympy), which a run pays only once it saves.

MANIFEST = "manifest.json"
LATEST = "latest"
STEP_RE = re.compile(r"^step-(\d{6,})$")
TMP_GLOB = ".tmp-step-*"


def _optim_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _hush_single_process_notice() -> None:
    """DCP warns that a save without torch.distributed is one process's: here it always
    is on purpose. A filter (set again at every save; it is not duplicated) rather than
    ``catch_warnings``, which is not safe while a background save warns from its thread."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled.*intent is to save")


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def train_state_name(rank: int) -> str:
    return f"train_state-rank{rank:05d}.json"


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


# --- model and optimizer state ------------------------------------------------------


def model_state(parts: list[torch.nn.Module]) -> dict[str, Any]:
    """The model state the checkpoints hold: every part's, or only its trainable
    parameters under a model transform that saves only its own (LoRA's adapters; the
    frozen base comes from its pretrained weights or the seed)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    merged: dict[str, Any] = {}
    for part in parts:
        state = get_model_state_dict(part)
        if saves_trainable_only(part):
            trainable = {name for name, param in part.named_parameters() if param.requires_grad}
            state = {key: value for key, value in state.items() if key in trainable}
        merged.update(state)
    return merged


def optimizer_state(parts: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    merged: dict[str, Any] = {}
    for part, optimizer in zip(parts, optimizers, strict=True):
        merged.update(get_optimizer_state_dict(part, optimizer, options=_optim_options()))
    return merged


def _set_model(parts: list[torch.nn.Module], merged: dict[str, Any]) -> None:
    """Load a merged model state into every part (each takes its own keys; a part whose
    checkpoints hold only its trainable parameters takes those)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    strict = StateDictOptions(strict=len(parts) == 1 and not any(map(saves_trainable_only, parts)))
    for part in parts:
        set_model_state_dict(part, merged, options=strict)


def load_model(path: Path, parts: list[torch.nn.Module], *, verified: bool = False) -> None:
    """Load only the model weights of a checkpoint into ``parts``: the one function
    every reader of weights (``sample``, ``export-hf``, evaluation, import) calls. A part
    still on the meta device (the pretrained base of an adapter checkpoint) is
    materialised on the CPU first.
    Integrity is checked first unless the caller already did (``verified``: the path
    came from :func:`resolve_checkpoint` or :func:`find_latest`); the files are read
    without running code from them either way."""
    from forge_core.train.checkpoint_reader import load_state

    path = Path(path)
    if not verified:
        why = problem_with(path)
        if why:
            raise ForgeError(f"checkpoint {path} cannot be used: {why}")
    for part in parts:  # the base of an adapter checkpoint loads its pretrained weights here
        materialize(part, "cpu")
    state = {"model": model_state(parts)}
    load_state(state, path, no_dist=not is_distributed())
    _set_model(parts, state["model"])


def saved_model_differences(
    path: Path, parts: list[torch.nn.Module], gather: Callable[[Any], list[Any]]
) -> list[str]:
    """How the model state of the checkpoint at ``path`` and what ``parts`` would load
    (:func:`model_state`, every process's, through ``gather``) differ: names only one
    has, shapes that differ. For a checkpoint that records no adapter settings (written
    by an older Forge), where fewer adapters would otherwise load silently."""
    from forge_core.train.checkpoint_reader import read_metadata

    saved = {
        key.removeprefix("model."): list(meta.size)
        for key, meta in read_metadata(path).state_dict_metadata.items()
        if key.startswith("model.") and hasattr(meta, "size")
    }
    wanted: dict[str, list[int]] = {}
    for local in gather({key: list(value.shape) for key, value in model_state(parts).items()}):
        wanted.update(local)
    found = [
        f"{key}: in the checkpoint, not in the configured model" for key in sorted(set(saved) - set(wanted))
    ]
    found += [
        f"{key}: in the configured model, not in the checkpoint" for key in sorted(set(wanted) - set(saved))
    ]
    found += [
        f"{key}: shape {saved[key]} in the checkpoint, {wanted[key]} in the configured model"
        for key in sorted(set(saved) & set(wanted))
        if saved[key] != wanted[key]
    ]
    return found


# --- integrity ----------------------------------------------------------------------


def _sha256(path: Path) -> str:
    """Hashed through a memory map: no copy into Python buffers (about 30% faster)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return hashlib.sha256().hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return hashlib.sha256(view).hexdigest()


def digests(paths: list[Path]) -> dict[str, str]:
    """SHA-256 of each file by name, several files at once (hashlib releases the GIL).
    SHA-256 rather than a CRC: a standard digest anyone can check (``sha256sum``), at
    0.5-1.5 GB/s per core, which is small beside writing the checkpoint."""
    workers = min(len(paths), os.cpu_count() or 1, 8)
    if workers <= 1:
        return {p.name: _sha256(p) for p in paths}
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip((p.name for p in paths), pool.map(_sha256, paths)))


def _manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested absurdly deep
        return None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, int) for v in files.values()):
        return None
    sums = manifest.get("sha256")
    if sums is not None and not (isinstance(sums, dict) and all(isinstance(v, str) for v in sums.values())):
        return None
    return manifest


def has_checksums(path: Path) -> bool:
    manifest = _manifest(path)
    return bool(manifest and manifest.get("sha256") is not None)


def problem_with(path: Path) -> str | None:
    """Why ``path`` is not a complete, intact checkpoint, or ``None`` when it is. Raises
    :class:`UnsafeCheckpoint` for a ``.metadata`` made to run code."""
    from forge_core.train.checkpoint_reader import METADATA, CorruptCheckpoint, read_metadata

    if not path.is_dir():
        return "the directory does not exist"
    manifest = _manifest(path)
    if manifest is None:
        return f"{MANIFEST} is missing or unreadable (the write did not finish)"
    files: dict[str, int] = manifest["files"]
    for name, size in files.items():
        file = path / name
        if Path(name).name != name or name in ("", ".", ".."):
            return f"{MANIFEST} lists {name!r}, which is not a file of this directory"
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, the manifest says {size} (truncated?)"
    sums = manifest.get("sha256")
    if sums is not None:
        if set(sums) != set(files):
            return f"{MANIFEST} has checksums for other files than it lists"
        actual = digests([path / name for name in sorted(files)])
        for name in sorted(files):
            if actual[name] != sums[name]:
                return f"{name} does not match its SHA-256 in {MANIFEST} (damaged after it was written)"
    if METADATA not in files:
        return f"{METADATA} is not in {MANIFEST}"
    try:
        read_metadata(path)
    except CorruptCheckpoint as exc:
        return str(exc)
    for name in sorted(files):
        if name.startswith("train_state-"):
            try:
                train_state.read(path / name)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                return f"{name} is not a readable train state ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def _accept(path: Path, warn: Callable[[str], None]) -> Path:
    if not has_checksums(path):
        warn(
            f"checkpoint {path} has no checksums (written by an older Forge): its files were checked "
            f"by size only. The next checkpoint this run saves records them."
        )
    return path


def step_of(path: Path) -> int:
    match = STEP_RE.match(path.name)
    return int(match.group(1)) if match else -1


def _step_dirs(root: Path) -> list[Path]:
    """Checkpoint directories under ``root`` by name, newest first."""
    if not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if STEP_RE.match(p.name) and p.is_dir()), key=step_of, reverse=True
    )


def complete_checkpoints(root: Path) -> list[Path]:
    """Intact checkpoints under ``root``, oldest first."""
    return [p for p in reversed(_step_dirs(root)) if problem_with(p) is None]


def _read_pointer(root: Path, warn: Callable[[str], None]) -> str | None:
    """The checkpoint name ``latest`` holds, or ``None`` (absent or unusable: warned)."""
    pointer = root / LATEST
    if not pointer.exists():
        return None
    if not pointer.is_file():
        warn(f"{pointer} is not a file; ignoring it and taking the newest complete checkpoint")
        return None
    try:
        return pointer.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        warn(f"{pointer} is unreadable ({exc}); ignoring it and taking the newest complete checkpoint")
        return None


def find_latest(root: Path, warn: Any = None) -> Path | None:
    """The checkpoint to resume from: ``latest`` when complete, else the newest
    complete one. ``warn(message)`` is told about every checkpoint skipped."""
    warn = warn or (lambda message: None)
    skipped = None
    name = _read_pointer(root, warn)
    if name is not None:
        candidate = root / name
        why = problem_with(candidate) if STEP_RE.match(name) else f"{name!r} is not a checkpoint name"
        if why is None:
            return _accept(candidate, warn)
        warn(f"skipping checkpoint {candidate}: {why}; falling back to the newest complete one")
        skipped = candidate
    for path in _step_dirs(root):
        if path == skipped:
            continue
        why = problem_with(path)
        if why is None:
            return _accept(path, warn)
        warn(f"skipping checkpoint {path}: {why}")
    return None


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """``(checkpoint dir, run dir)`` for a run directory, its ``checkpoints`` directory or
    one checkpoint directory. The checkpoint returned is complete (verified)."""
    path = Path(path)

    def warn(message: str) -> None:
        print(f"warning: {message}", file=sys.stderr)

    if (path / MANIFEST).is_file():
        why = problem_with(path)
        if why:
            raise ForgeError(f"checkpoint {path} cannot be used: {why}")
        return _accept(path, warn), path.parent.parent
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    found = find_latest(root, warn)
    if found is None:
        raise ForgeError(
            f"no complete checkpoint under {path}. Give a run directory (the run's out_dir) or a "
            f"checkpoint directory (…/checkpoints/step-000100); a run saves one at the end, every "
            f"checkpoint.every steps and on SIGTERM/SIGINT."
        )
    return found, root.parent


def no_usable_checkpoint(root: Path, skipped: list[str]) -> ForgeError:
    """The refusal of a run directory holding checkpoints none of which can be loaded:
    each one with why, and the ways out."""
    fallback = "; falling back to the newest complete one"
    listed = "\n".join(
        "  - " + message.removeprefix("skipping checkpoint ").removesuffix(fallback) for message in skipped
    )
    return ForgeError(
        f"{root} holds checkpoints, but none of them can be loaded:\n{listed}\n"
        f"Refusing to start again from step 0 over them. To train from scratch, set "
        f"checkpoint.resume: never (the damaged checkpoints are replaced as new ones are saved), "
        f"or give the run another run.out_dir; or delete the damaged checkpoints "
        f"(rm -r {root}/step-*) if they are no longer needed."
    )


# --- files on disk ------------------------------------------------------------------


def remove_stale_temporaries(run_dir: Path) -> tuple[list[Path], int]:
    """Remove what interrupted writes left in a run directory (half-written checkpoints,
    ``atomic_write`` temporaries): ``(paths removed, bytes freed)``. Only call it while
    holding the run's lock: another run's writes in progress look the same."""
    root = run_dir / "checkpoints"
    found = [p for p in root.glob(TMP_GLOB) if p.is_dir()] if root.is_dir() else []
    for directory in (run_dir, root):
        if directory.is_dir():
            found += [p for p in directory.iterdir() if ATOMIC_TMP_RE.match(p.name) and p.is_file()]
    freed = 0
    for path in found:
        if path.is_dir():
            freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path, ignore_errors=True)
        else:
            freed += path.stat().st_size
            path.unlink(missing_ok=True)
    return found, freed


def _checkpoint_exception() -> type[BaseException] | tuple[()]:
    """DCP's ``CheckpointException``, or no class (``isinstance(e, ())`` is False) while
    DCP is not imported: then nothing can have raised one."""
    api = sys.modules.get("torch.distributed.checkpoint.api")
    return () if api is None else api.CheckpointException


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, what it was raised from, and what a DCP ``CheckpointException`` carries
    from each rank."""
    dcp_error = _checkpoint_exception()
    seen: list[BaseException] = []
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        if isinstance(e, dcp_error):
            stack += [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
        stack += [e.__cause__, e.__context__]
    return seen


def is_disk_full(exc: BaseException, path: Path, needed: int | None = None) -> bool:
    """Whether ``exc`` (from writing under ``path``) means the disk or quota is full.
    torch's zip writer reports a short write as ``unexpected pos``: count it as full
    when the file system has less room than the write needed."""
    dcp_error = _checkpoint_exception()
    for e in _causes(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if not isinstance(e, dcp_error) and "No space left on device" in str(e):
            return True  # wrapped by a library (safetensors reports the OS error in its text)
        if isinstance(e, RuntimeError) and "unexpected pos" in str(e):
            free = free_bytes(path)
            return free is not None and free < max(needed or 0, 1 << 20)
    return False


def free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def no_space_message(path: Path, what: str, needed: int | None = None) -> str:
    """The first sentence of every disk-full error: what was being written where, how
    much room there is and (when known) how much was needed."""
    free = free_bytes(path)
    room = f"{_megabytes(free)} free there" if free is not None else "no room left"
    need = f", and about {_megabytes(needed)} were needed" if needed else ""
    return f"No space left on device writing {what} ({path}): {room}{need}."


def _state_bytes(state: Any) -> int:
    """Bytes of the tensors this process holds in ``state`` (local shards)."""
    if isinstance(state, dict):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    return 0


def _agree(error: str | None, group: Any = None) -> str | None:
    """Every process learns the first error any of them had (and waits for the others,
    like a barrier), so one process failing never leaves the others waiting. ``group``:
    the process group (the default one when ``None``)."""
    if not is_distributed():
        return error
    import torch.distributed as dist

    errors: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    return next((e for e in errors if e), None)


# --- save and load ------------------------------------------------------------------


class CheckpointManager:
    """Saves and finds checkpoints of one run. Every process calls ``save`` and
    ``load``; directory bookkeeping happens on rank 0 between agreements. With
    ``background`` (``checkpoint.async``) a save returns once the state is copied in
    memory; :meth:`poll`, :meth:`wait` and the next :meth:`save` complete it."""

    def __init__(
        self, run_dir: str | Path, keep: int, rank: int, world_size: int, background: bool = False
    ) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.rank = rank
        self.world_size = world_size
        self.background = background
        #: Checkpoints known intact: saved or resumed by this process, or verified here.
        #: A background save changes it (and prunes) only while no caller looks: callers
        #: wait for it first.
        self.intact: set[Path] = set()
        #: The background save not yet collected, if any.
        self.in_flight: checkpoint_async.InFlight | None = None

    def _last_intact(self) -> Path | None:
        return max(self.intact, key=step_of) if self.intact else None

    def _attempt(
        self, fn: Callable[[], Any], run: bool, tmp: Path, step: int, needed: int | None, group: Any = None
    ) -> None:
        """One part of a save, then agreement (over ``group``): when any process failed,
        rank 0 removes the partial write and every process raises; a full disk is a
        :class:`ForgeError`."""
        from torch.distributed.checkpoint.api import CheckpointException

        failure: BaseException | None = None
        if run:
            try:
                fn()
            except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
                failure = exc
        message = None
        full = failure is not None and is_disk_full(failure, self.root, needed)
        if full:
            previous = self._last_intact()
            kept = (
                f"The partial write was removed; the previous checkpoint ({previous}) is intact and "
                f"`latest` still names it, so the next start resumes there."
                if previous
                else "The partial write was removed; no checkpoint of this run exists yet."
            )
            message = (
                f"{no_space_message(tmp, f'checkpoint {step_name(step)}', needed)} {kept} Free some "
                f"space (or move run.out_dir to a larger disk, or lower checkpoint.keep) and run again."
            )
        elif failure is not None:
            message = f"process {self.rank} failed while writing {tmp}: {type(failure).__name__}: {failure}"
        agreed = _agree(message, group)
        if agreed is None:
            return
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if failure is not None and not full:
            raise failure
        raise ForgeError(agreed)

    def save(
        self,
        step: int,
        parts: list[torch.nn.Module],
        optimizers: list[torch.optim.Optimizer],
        state: dict[str, Any],
        writing: Callable[[Path], None] | None = None,
        saved: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write the checkpoint of ``step`` and move ``latest`` to it; returns its path.
        ``writing(tmp)`` is called on every process once its own files are in the
        temporary directory ``tmp``, before the manifest is made (the
        ``forge_checkpoint_writing`` hook): files it adds there are part of the
        checkpoint; an exception it raises fails the save like a failed write (partial
        write removed, ``latest`` unchanged). ``saved(path)`` is called once the
        checkpoint is complete: before this returns, or in the background mode from the
        :meth:`poll` or :meth:`wait` that finds it complete. There, the model and
        optimizer files are written after ``writing`` and in the background; the save of
        the previous call, if still in flight, is waited for first."""
        import torch.distributed.checkpoint as dcp

        from forge_core.train import checkpoint_async

        self.wait()
        _hush_single_process_notice()
        final = self.root / step_name(step)
        tmp = self.root / f".tmp-{step_name(step)}"
        full_state = {"model": model_state(parts), "optim": optimizer_state(parts, optimizers)}
        previous = self._last_intact()
        # What the write needs: the previous checkpoint's size, else (alone) the state's.
        needed = (
            self._size_of(previous)
            if previous
            else (_state_bytes(full_state) if self.world_size == 1 else None)
        )
        no_dist = not is_distributed()

        def start() -> None:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()

        def write_state() -> None:
            train_state.write(tmp / train_state_name(self.rank), {**state, "world_size": self.world_size})
            if writing is not None:
                writing(tmp)

        def finish() -> None:
            sync_tree(tmp)  # what plugins wrote too: on disk before the manifest vouches for it
            names = sorted(p.name for p in tmp.iterdir() if p.is_file())
            manifest = {
                "step": step,
                "world_size": self.world_size,
                "files": {n: (tmp / n).stat().st_size for n in names},
                "sha256": digests([tmp / n for n in names]),
            }
            atomic_write(tmp / MANIFEST, json.dumps(manifest, indent=1))
            if final.exists():  # an older write of the same step: the new one replaces it
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_dir(self.root)
            pointer = self.root / LATEST
            if pointer.is_dir() and not pointer.is_symlink():  # damaged: make room for the pointer
                shutil.rmtree(pointer)
            atomic_write(pointer, final.name + "\n")

        def complete(group: Any = None) -> None:
            self._attempt(finish, self.rank == 0, tmp, step, needed, group)
            self.intact.add(final)
            if self.rank == 0:
                self._prune(final)

        def announce() -> None:
            if saved is not None:
                saved(final)

        self._attempt(start, self.rank == 0, tmp, step, needed)
        if not self.background:

            def write() -> None:
                dcp.save(full_state, checkpoint_id=str(tmp), no_dist=no_dist)
                write_state()

            self._attempt(write, True, tmp, step, needed)
            complete()
            announce()
            return final

        group = checkpoint_async.process_group()
        copy: dict[str, Any] = {}
        upload: list[Any] = []

        def launch() -> None:
            upload.append(
                dcp.async_save(
                    copy,
                    checkpoint_id=str(tmp),
                    process_group=group,
                    async_stager=checkpoint_async.Staged(),
                    no_dist=no_dist,
                )
            )

        self._attempt(write_state, True, tmp, step, needed)
        # The copy, then the write: agreed apart, so no process starts writing (and
        # waiting in the write's collectives) when another could not make its copy.
        self._attempt(lambda: copy.update(checkpoint_async.stage(full_state)), True, tmp, step, needed)
        self._attempt(launch, True, tmp, step, needed)

        def in_background() -> None:
            self._attempt(upload[0].result, True, tmp, step, needed, group)
            complete(group)

        self.in_flight = checkpoint_async.InFlight(in_background, announce)
        return final

    def poll(self) -> None:
        """Collect a background save that is complete (calling its ``saved``), without
        waiting: O(1), no collective. One that failed is left for :meth:`wait` to raise."""
        if self.in_flight is not None and self.in_flight.poll():
            self.in_flight = None

    @property
    def save_failed(self) -> bool:
        """Whether the background save in flight has failed (:meth:`wait` raises why)."""
        return self.in_flight is not None and self.in_flight.failed()

    def wait(self) -> None:
        """Until the background save in flight, if any, is complete (its ``saved`` called)
        or has failed: then raise as the save would have (partial write removed, ``latest``
        unchanged, a full disk a :class:`ForgeError`)."""
        in_flight, self.in_flight = self.in_flight, None
        if in_flight is not None:
            in_flight.wait()

    def _size_of(self, path: Path) -> int | None:
        manifest = _manifest(path)
        return sum(manifest["files"].values()) if manifest else None

    def _verified(self, path: Path) -> bool:
        if path not in self.intact and problem_with(path) is None:
            self.intact.add(path)
        return path in self.intact

    def _prune(self, newest: Path) -> None:
        """Keep ``newest`` and the ``keep - 1`` newest older checkpoints that are intact
        (verifying only those it has to); delete the other older ones."""
        kept = 1
        for old in _step_dirs(self.root):
            if step_of(old) >= step_of(newest):
                continue  # newest itself; or newer leftovers skipped at resume (replaced when reached)
            if kept < self.keep and self._verified(old):
                kept += 1
            else:
                shutil.rmtree(old, ignore_errors=True)
                self.intact.discard(old)
        for stale in self.root.glob(TMP_GLOB):
            shutil.rmtree(stale, ignore_errors=True)

    def find_resume(self, warn: Any) -> Path | None:
        """Rank 0 picks (and verifies) the checkpoint; every process gets the same answer,
        or the same error. Checkpoints that exist but none of which can be loaded are an
        error (:func:`no_usable_checkpoint`): a run never starts again from step 0 over
        them on its own."""
        found: Any = None
        if self.rank == 0:
            skipped: list[str] = []
            try:
                path = find_latest(self.root, skipped.append)
                if path is None and _step_dirs(self.root):
                    raise no_usable_checkpoint(self.root, skipped)
                for message in skipped:
                    warn(message)
                found = None if path is None else str(path)
            except ForgeError as exc:
                found = exc
        found = broadcast_object(found)
        if isinstance(found, ForgeError):
            raise found
        return None if found is None else Path(found)

    def load(
        self,
        path: Path,
        parts: list[torch.nn.Module],
        optimizers: list[torch.optim.Optimizer],
        warn: Callable[[str], None] | None = None,
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint :meth:`find_resume` chose (it verified it). Written by
        another number of processes, it is resharded and ``warn`` is told what cannot
        carry over (see :mod:`forge_core.train.elastic`). ``check`` sees the train state
        before any tensor is read, so a refusal it raises comes before a shape mismatch."""
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        from forge_core.train.checkpoint_reader import load_state

        saved_world = self._saved_world(path)
        state_file = path / train_state_name(elastic.source_rank(self.rank, saved_world))
        try:
            state = train_state.read(state_file)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ForgeError(f"cannot read {state_file}: {exc}") from None
        if check is not None:
            check(state)
        if saved_world != self.world_size and warn is not None:
            warn(elastic.notice(path, saved_world, self.world_size))
        full = {"model": model_state(parts), "optim": optimizer_state(parts, optimizers)}
        try:
            load_state(full, path, no_dist=not is_distributed())
        except (RuntimeError, CheckpointException) as exc:  # dcp wraps each rank's error
            said = " ".join([str(exc), *map(str, getattr(exc, "failures", {}).values())])
            # The message, not the source line quoted in the traceback (``{fqn}``).
            missing = re.findall(r"Missing key in checkpoint state_dict: ([\w.]+)", said)
            resized = re.findall(
                r"Size mismatch between saved torch.Size\((\[[\d, ]*\])\) and current: "
                r"torch.Size\((\[[\d, ]*\])\) for ([\w.]+)",
                said,
            )
            if resized and not missing:  # another shape under the same names
                saved, now, key = resized[-1]
                raise ForgeError(
                    f"cannot resume from {path}: its {key.removeprefix('model.')!r} has shape {saved}, the "
                    f"configured model's has {now}, so it was written for another model shape (or other "
                    "adapter settings). Resume with the config it was written with (the run's "
                    "config.yaml), or give this one a new run.out_dir."
                ) from None
            if not missing:
                raise
            lacking = missing[-1].rstrip(".").removeprefix("model.")
            raise ForgeError(
                f"cannot resume from {path}: it holds no {lacking!r}, which the configured "
                "model has, so it was written for another model (its shape or its blocks differ). "
                "Resume with the config it was written with, or give this one a new run.out_dir."
            ) from None
        _set_model(parts, full["model"])
        for part, optimizer in zip(parts, optimizers, strict=True):
            set_optimizer_state_dict(part, optimizer, full["optim"], options=_optim_options())
        self.intact.add(path)
        if self.rank == 0:  # a run killed before it pruned, or with nothing left to train, prunes here
            self._prune(path)
        return state

    @staticmethod
    def _saved_world(path: Path) -> int:
        """How many processes wrote ``path``: its manifest says, else its train states."""
        manifest = _manifest(path) or {}
        world = manifest.get("world_size")
        if isinstance(world, int) and world >= 1:
            return world
        return max(1, len(list(path.glob("train_state-rank*.json"))))
