"""Reading a local Hugging Face model folder without torch: ``config.json``, the
safetensors files (one ``model.safetensors`` or shards listed by
``model.safetensors.index.json``) and their JSON headers (names, shapes, dtypes).

Only ``json`` is used, so ``forge-run check`` can judge a folder in milliseconds and no
code from it ever runs: a ``config.json`` naming its own code (``auto_map``) is refused,
and pickled weights (``*.bin``) are never read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError
from forge_core.api.unstable import METADATA_LIMIT, FileRefused, read_small_text

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: The safetensors format caps its JSON header at 100 MB.
_MAX_SAFETENSORS_HEADER = 100_000_000


class HFFolderMissing(ForgeError, FileNotFoundError):
    """The ``init_from_hf`` folder, its ``config.json`` or its weights are not there."""


class HFFolderMismatch(ForgeError, ValueError):
    """The ``init_from_hf`` folder does not fit the model options (every reason listed)."""


def where(hf_dir: str | Path) -> str:
    return f"model.options.init_from_hf={str(hf_dir)!r}"


def read_hf_config(hf_dir: str | Path) -> dict[str, Any]:
    """``config.json`` of a Hugging Face folder as a mapping."""
    folder = Path(hf_dir)
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise HFFolderMissing(
            f"{where(hf_dir)}: the folder {what} (so there is no config.json); point it at a "
            "local Hugging Face model folder (as written by save_pretrained)"
        )
    path = folder / "config.json"
    if not path.exists():  # something else than a file is refused when read
        raise HFFolderMissing(
            f"{where(hf_dir)}: no config.json there; point it at a local Hugging Face model "
            "folder (as written by save_pretrained)"
        )
    try:
        config = json.loads(read_small_text(path, METADATA_LIMIT, "config.json"))
    except FileRefused as exc:
        raise HFFolderMismatch(f"{where(hf_dir)}: {exc}") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: JSONDecodeError, and integers beyond Python's digit limit.
        raise HFFolderMismatch(f"{where(hf_dir)}: config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise HFFolderMismatch(f"{where(hf_dir)}: config.json holds {type(config).__name__}, not an object")
    if config.get("auto_map"):
        raise HFFolderMismatch(
            f"{where(hf_dir)}: {path} names custom model code (auto_map: "
            f"{json.dumps(config['auto_map'])[:200]}). Forge never runs code from model folders: it reads "
            "config.json and the safetensors weights itself, and only the standard Llama, Qwen2, Qwen3, "
            "Mistral, OLMo 2, Qwen3-MoE and Mixtral architectures map onto its llama"
        )
    return config


def _roots(folder: Path) -> tuple[Path, ...]:
    """Where a folder's weight files may lie once symlinks are resolved: the folder, and
    for a snapshot of the Hugging Face hub cache (``models--org--name/snapshots/REV``,
    whose files link to ``../../blobs/HASH``) that model's blobs."""
    real = folder.resolve()
    return (real, real.parent.parent / "blobs") if real.parent.name == "snapshots" else (real,)


def _outside(folder: Path, files: dict[str, str]) -> list[str]:
    """``"file (for entry, leads to path)"`` for every weight file that leaves the folder
    (an absolute path, ``..``, a symlink out of it), given ``entry -> file``."""
    roots = _roots(folder)
    first: dict[str, str] = {}
    for key, name in files.items():
        first.setdefault(name, key)
    found = []
    for name, key in first.items():
        try:
            real = str((folder / name).resolve())
            inside = any(Path(real).is_relative_to(root) for root in roots)
        except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a symlink loop
            real, inside = f"nowhere: {exc}", False
        if not inside:
            entry = f"for {key!r}, " if key != name else ""
            found.append(f"{name!r} ({entry}leads to {real})")
    return found


def _refuse_outside(hf_dir: str | Path, what: str, outside: list[str]) -> None:
    if outside:
        raise HFFolderMismatch(
            f"{where(hf_dir)}: {what} weight files outside the folder: {'; '.join(outside[:3])}"
            f"{f' and {len(outside) - 3} more' if len(outside) > 3 else ''}. A checkpoint's weight "
            "files lie in its own folder: copy them there and name them relative to it (as "
            "save_pretrained writes them)"
        )


def weight_map(hf_dir: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (from the sharded index, or the
    single file's header). A file outside the folder is refused: an index naming
    ``../other/model.safetensors`` or ``/abs/path`` would make ``check`` judge, and the
    build load, weights the folder does not hold."""
    folder = Path(hf_dir)
    index = folder / INDEX
    if index.is_file():
        try:
            names = json.loads(read_small_text(index, METADATA_LIMIT, INDEX))["weight_map"]
            files = {str(key): file for key, file in names.items()}
            if not all(isinstance(file, str) and file for file in files.values()):
                raise TypeError("a weight_map entry is not a file name")
        except FileRefused as exc:
            raise HFFolderMismatch(f"{where(hf_dir)}: {exc}") from None
        except (OSError, ValueError, RecursionError, LookupError, TypeError, AttributeError) as exc:
            raise HFFolderMismatch(f"{where(hf_dir)}: {INDEX} is not a safetensors index ({exc!r})") from None
        _refuse_outside(hf_dir, f"{INDEX} names", _outside(folder, files))
        mapping = {key: folder / file for key, file in files.items()}
        absent = sorted({path.name for path in mapping.values() if not path.is_file()})
        if absent:
            raise HFFolderMissing(
                f"{where(hf_dir)}: {INDEX} names {', '.join(absent[:5])}, which are not there"
            )
        return mapping
    if (folder / SINGLE).is_file():
        _refuse_outside(hf_dir, f"{SINGLE} links to", _outside(folder, {SINGLE: SINGLE}))
        return {key: folder / SINGLE for key in safetensors_header(folder / SINGLE)}
    others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
    found = f" (found {', '.join(others[:3])}: not read, pickles can run code)" if others else ""
    raise HFFolderMissing(
        f"{where(hf_dir)}: no {SINGLE} (or sharded {INDEX}){found}; only safetensors weights "
        "are read; re-save the model with save_pretrained(safe_serialization=True)"
    )


def safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> ``{"dtype", "shape", "data_offsets"}`` from a safetensors file's
    JSON header (no tensor is read)."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= min(_MAX_SAFETENSORS_HEADER, path.stat().st_size - 8):
                raise ValueError(f"header length {size}")
            header = json.loads(f.read(size))
        return {name: entry for name, entry in header.items() if name != "__metadata__"}
    except (OSError, ValueError, RecursionError, TypeError, AttributeError) as exc:
        raise HFFolderMismatch(f"{path}: not a readable safetensors file ({exc})") from None


def checkpoint_shapes(hf_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over every weight file of the folder."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(set(weight_map(hf_dir).values())):
        try:
            shapes.update(
                {
                    name: tuple(int(d) for d in entry["shape"])
                    for name, entry in safetensors_header(path).items()
                }
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise HFFolderMismatch(f"{path}: not a readable safetensors file ({exc!r})") from None
    return shapes


def checkpoint_bytes(hf_dir: str | Path) -> int:
    """The size of the folder's weight files."""
    return sum(path.stat().st_size for path in set(weight_map(hf_dir).values()))
