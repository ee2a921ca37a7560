"""Reading ``torch.distributed.checkpoint`` (DCP) files without running code from them.

A checkpoint directory may come from someone else, so nothing in it may execute code
when Forge reads it. DCP itself has two pickle paths that would:

- ``.metadata`` is a pickle that ``FileSystemReader.read_metadata`` unpickles with
  plain :func:`pickle.load`. Here it is unpickled by :class:`MetadataUnpickler`, which
  constructs only what DCP writes there (:data:`ALLOWED_GLOBALS`): the dataclasses of
  ``torch.distributed.checkpoint.metadata``, ``filesystem._StorageInfo``,
  ``torch.Size``, the ``torch`` dtypes, ``torch.serialization._get_layout`` (how a
  layout pickles), ``pathlib`` paths and ``collections.OrderedDict``. Anything else
  (``os.system``, ``builtins.eval``, ``operator.getitem``...) raises
  :class:`UnsafeCheckpoint` before it is called. The result is then checked for shape:
  every storage entry points at a plain file name inside the checkpoint directory, and
  per file the entries tile it exactly (an offset or a length that lies is refused
  before any read).
- Non-tensor state (the optimizer's lr, betas, eps...) is stored as byte blobs that
  ``DefaultLoadPlanner.load_bytes`` reads with ``torch.load(weights_only=False)``.
  :class:`SafeLoadPlanner` reads them with ``weights_only=True``. (Tensors DCP already
  reads with ``weights_only=True``.)

:func:`load_state` is the one way Forge loads a DCP directory; checkpoint integrity
(sizes, checksums) is :mod:`forge_core.train.checkpoint`'s job.
"""

from __future__ import annotations

import io
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo

from forge_core.api import ForgeError

METADATA = ".metadata"

#: Everything a DCP ``.metadata`` file may construct, by module. Each of these is safe
#: to call with any arguments: dataclass constructors, ``torch.Size``, an Enum lookup,
#: a lookup of a layout by name, a path object (no file is touched), a dict.
ALLOWED_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
            "StorageMeta",
            "MetadataIndex",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),  # and every torch.dtype, see MetadataUnpickler
    "torch.serialization": frozenset({"_get_layout"}),
    "pathlib": frozenset({"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
}


class UnsafeCheckpoint(ForgeError):
    """A checkpoint file asks to construct something DCP never writes: refused."""


class CorruptCheckpoint(ForgeError):
    """A checkpoint file cannot be read as what DCP writes (damaged, not tampered)."""


def _ways_out(file: Path) -> str:
    """What to do about a checkpoint that was refused (every refusal says the same)."""
    return (
        f"Do not use this checkpoint: delete its directory ({file.parent}) to fall back to an earlier "
        "one, or start a new run (checkpoint.resume: never or another run.out_dir)."
    )


def _refusal(file: Path, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(
        f"refusing to load {file}: it asks to construct {what}, which torch.distributed.checkpoint "
        f"never writes there, so the file was made or altered to run code when loaded. Nothing from "
        f"it was executed. {_ways_out(file)}"
    )


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` file, constructing only :data:`ALLOWED_GLOBALS`.
    Persistent ids (which pickle would resolve through ``persistent_load``) are refused
    by :class:`pickle.Unpickler` itself."""

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _refusal(self.path, f"{module}.{name}")


def _check_shape(md: Any, path: Path) -> None:
    """The metadata is what DCP writes: storage entries are files in this directory."""
    if not isinstance(md, dcp_metadata.Metadata):
        raise CorruptCheckpoint(f"{path} holds a {type(md).__name__}, not checkpoint metadata")
    if not isinstance(md.state_dict_metadata, dict) or not all(
        isinstance(k, str)
        and isinstance(v, (dcp_metadata.TensorStorageMetadata, dcp_metadata.BytesStorageMetadata))
        for k, v in md.state_dict_metadata.items()
    ):
        raise CorruptCheckpoint(f"{path}: the state-dict entries are not what DCP writes")
    if not isinstance(md.storage_data, dict):
        raise CorruptCheckpoint(f"{path}: no storage entries")
    for index, info in md.storage_data.items():
        if not isinstance(index, dcp_metadata.MetadataIndex) or not isinstance(info, _StorageInfo):
            raise CorruptCheckpoint(f"{path}: a storage entry is not what DCP writes")
        name = info.relative_path
        if not isinstance(name, str) or name in ("", ".", "..") or re.search(r"[/\\\x00]", name):
            raise _refusal(path, f"a read of {name!r}, a file outside the checkpoint directory")
        if not all(isinstance(v, int) and v >= 0 for v in (info.offset, info.length)):
            raise CorruptCheckpoint(f"{path}: a storage entry of {name} has a bad offset or length")


def _check_against_files(md: Any, path: Path) -> None:
    """The storage entries describe the files beside the metadata: DCP writes each data
    file as its entries one after the other, so per file they tile it exactly, from
    offset 0 to its last byte. An offset or a length that points anywhere else would make
    DCP read the wrong bytes (or ask for 10^15 of them): refused before anything is read."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for info in md.storage_data.values():
        spans.setdefault(info.relative_path, []).append((info.offset, info.length))
    for name, entries in sorted(spans.items()):
        file = path.parent / name
        if not file.is_file():
            raise _misdescribed(path, f"storage entries read {name}, which is not a file beside it")
        size = file.stat().st_size
        end = 0
        for offset, length in sorted(entries):
            if offset != end:
                raise _misdescribed(
                    path,
                    f"a storage entry of {name} starts at byte {offset}, where the entry before it "
                    f"ends at {end}",
                )
            end = offset + length
        if end != size:
            raise _misdescribed(path, f"its storage entries cover {end} bytes of {name}, which has {size}")


def _misdescribed(path: Path, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(
        f"refusing to load {path}: {what}, so the metadata does not describe the files of its "
        f"checkpoint (torch.distributed.checkpoint writes each file as its entries end to end). It was "
        f"altered after the checkpoint was written; nothing was read through it. {_ways_out(path)}"
    )


def read_metadata(directory: str | Path) -> Any:
    """The DCP metadata of a checkpoint directory, unpickled safely and checked.
    Raises :class:`UnsafeCheckpoint` or :class:`CorruptCheckpoint`."""
    path = Path(directory) / METADATA
    try:
        with open(path, "rb") as f:
            md = MetadataUnpickler(f, path).load()
    except UnsafeCheckpoint:
        raise
    except OSError as exc:
        raise CorruptCheckpoint(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a damaged pickle
        raise CorruptCheckpoint(
            f"{path} is not readable checkpoint metadata ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    _check_shape(md, path)
    _check_against_files(md, path)
    return md


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` that serves metadata already read by :func:`read_metadata`
    (DCP's own ``read_metadata`` would ``pickle.load`` the file)."""

    def __init__(self, path: str | Path, metadata: Any) -> None:
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is not None:  # per-rank metadata: Forge never writes it
            raise FileNotFoundError(f"{self.path}: no per-rank metadata")
        md = self._metadata
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = dcp_metadata.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


_UNSUPPORTED = re.compile(r"[Uu]nsupported(?: global:)? GLOBAL ([\w.]+)")


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose non-tensor items are read with ``weights_only=True``."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - refused global or damaged bytes
            info = self.metadata.storage_data.get(read_item.storage_index) if self.metadata else None
            file = self.directory / (info.relative_path if info else "?")
            found = _UNSUPPORTED.search(str(exc))
            what = found.group(1) if found else f"something unreadable ({type(exc).__name__})"
            raise _refusal(file, f"{what} (in the entry {read_item.dest_index.fqn!r})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _failure_in(exc: BaseException) -> BaseException:
    """The first ForgeError a DCP ``CheckpointException`` carries (from any rank), or
    ``exc`` itself."""
    if isinstance(exc, CheckpointException):
        for failure in exc.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, ForgeError):
                return inner
    return exc


def load_state(state: dict[str, Any], directory: str | Path, *, no_dist: bool) -> None:
    """``dcp.load(state, directory)`` with the safe metadata reader and planner."""
    directory = Path(directory)
    md = read_metadata(directory)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(
                state,
                storage_reader=SafeReader(directory, md),
                planner=SafeLoadPlanner(directory),
                no_dist=no_dist,
            )
    except CheckpointException as exc:
        inner = _failure_in(exc)
        if inner is exc:
            raise
        raise inner from None
