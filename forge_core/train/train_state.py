"""The small, per-process part of a checkpoint: step, RNG states, loader position,
non-finite counter. Stored as JSON (no pickle at all), with tuples, numpy arrays and
tensors tagged so they come back with their exact type, dtype and values. Reading
constructs nothing but those: a tag naming anything other than a torch or numpy dtype
is a ``ValueError``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1


def encode(obj: Any) -> Any:
    """Plain JSON data for ``obj`` (dicts with string keys, lists, tuples, scalars,
    numpy arrays and scalars, tensors)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return {
            "__tensor__": t.reshape(-1).tolist(),
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
        }
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.reshape(-1).tolist(), "dtype": str(obj.dtype), "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, str):
                raise TypeError(f"train state keys must be strings, got {key!r}")
        return {key: encode(value) for key, value in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in the train state")


def decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        dtype = getattr(torch, str(obj["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{obj['dtype']!r} is not a torch dtype")
        return torch.tensor(obj["__tensor__"], dtype=dtype).reshape(obj["shape"])
    if "__ndarray__" in obj:
        dtype = np.dtype(str(obj["dtype"]))
        if dtype.hasobject:
            raise ValueError(f"{obj['dtype']!r} is not a numeric numpy dtype")
        return np.asarray(obj["__ndarray__"], dtype=dtype).reshape(obj["shape"])
    if "__tuple__" in obj:
        return tuple(decode(v) for v in obj["__tuple__"])
    return {key: decode(value) for key, value in obj.items()}


def capture_rng(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def write(path: Path, state: dict[str, Any]) -> None:
    data = json.dumps({"format": FORMAT, **encode(state)}, allow_nan=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read(path: Path) -> dict[str, Any]:
    """The train state in ``path``; a ``ValueError`` for anything that is not one (a file
    nested deeper than Python can read included: its callers name the file)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
            raise ValueError(f"{path}: unknown train-state format")
        return decode(data)
    except RecursionError:
        raise ValueError("nested too deep to read (no train state Forge writes is)") from None
