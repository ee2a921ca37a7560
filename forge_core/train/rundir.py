"""The run directory: what a run leaves behind so ``sample`` and ``export-hf`` work from
it alone.

::

    <out_dir>/config.yaml     the resolved config (every default written out)
    <out_dir>/run.json        vocabulary size, tokenizer identity, parameter counts
    <out_dir>/tokenizer/      whatever ``tokenizer.save`` writes (may be empty)
    <out_dir>/checkpoints/    see :mod:`forge_core.train.checkpoint`
    <out_dir>/metrics.jsonl, loss.png, ...   written by loggers
    <out_dir>/run.lock        while a run uses the directory, see :mod:`forge_core.train.run_lock`
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from forge_core.api import ForgeError
from forge_core.api.files import atomic_write
from forge_core.config.loader import plugin_settings, to_plain
from forge_core.config.schema import PluginsSection
from forge_core.config.yaml_reader import read_config_file

CONFIG = "config.yaml"
RUN_INFO = "run.json"
TOKENIZER = "tokenizer"


def save_config(run_dir: Path, config: Any) -> None:
    atomic_write(run_dir / CONFIG, yaml.safe_dump(to_plain(config), sort_keys=False))


def save_run_info(run_dir: Path, info: dict[str, Any]) -> None:
    atomic_write(run_dir / RUN_INFO, json.dumps(info, indent=1, sort_keys=True) + "\n")


def read_run_info(run_dir: Path) -> dict[str, Any]:
    try:
        info = json.loads((run_dir / RUN_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested absurdly deep
        return {}
    return info if isinstance(info, dict) else {}


def load_run_config(run_dir: Path) -> tuple[Any, Any]:
    """``(plan, registries)`` of the run that wrote ``run_dir``: the
    :class:`~forge_core.api.Plan` of its saved config, from which ``sample`` and
    ``export-hf`` build its components. A config saved before a key moved is read with
    the key at its new place (Forge wrote it, so the move is Forge's to make)."""
    from forge_core.config.loader import structure_config
    from forge_core.config.overrides import migrate_moved_keys
    from forge_core.plan import make_plan
    from forge_core.registry import load_registries

    path = run_dir / CONFIG
    if not path.is_file():
        raise ForgeError(f"{run_dir} has no {CONFIG}: is it the out_dir of a Forge run?")
    raw = migrate_moved_keys(read_config_file(path))
    plugins = plugin_settings(raw) or PluginsSection()
    registries = load_registries(block=tuple(plugins.block), prefer=plugins.prefer)
    config = structure_config(raw, lambda _: registries)
    return make_plan(config, registries, world_size=None), registries


#: Config paths (a section, a block or a key) whose change alters what a resumed run
#: computes: a resume warns when one of them differs from the saved config.
AFFECTS_RESULTS = ("run.seed", "model", "attention", "data", "train")
#: Paths inside those that do not: how fast batches are loaded, the MFU figure, and the
#: run's length and schedule span (a resumed run reports those itself, with the
#: learning rates involved).
#:
#: Left out entirely: logging.*, checkpoint.*, run.name, run.out_dir, run.device and
#: run.collective_timeout, plugins.*, and parallel.* and train.compile, which change
#: only speed and the rounding of sums (a resume with another process count says so
#: itself).
NOT_RESULTS = (
    "data.num_workers",
    "train.peak_tflops",
    "train.compile",
    "train.steps",
    "train.schedule_steps",
)


def _within(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in prefixes)


def affects_results(path: str) -> bool:
    """Whether a change of the config at dotted ``path`` changes what a resumed run computes."""
    return _within(path, AFFECTS_RESULTS) and not _within(path, NOT_RESULTS)


def changed_settings(run_dir: Path, config: Any) -> list[str]:
    """Dotted paths whose value differs between the saved config and ``config``, among
    those that change what a resumed run computes (:func:`affects_results`)."""
    path = run_dir / CONFIG
    if not path.is_file():
        return []
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []
    changed: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                walk(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        elif a != b and affects_results(prefix):
            changed.append(prefix)

    walk(saved, to_plain(config), "")
    return changed


#: Names that only a Forge run directory or a checkpoint holds: a folder with one of them
#: anywhere inside is never replaced by an export.
RUN_MARKERS = frozenset({".metadata", "manifest.json", "run.json", "run.lock", "checkpoints"})


def holds_run(folder: Path) -> Path | None:
    """The first file or folder under ``folder`` that marks a Forge run or checkpoint
    (:data:`RUN_MARKERS`), or ``None``. Symlinks inside are not followed."""
    for directory, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            if name in RUN_MARKERS:
                return Path(directory) / name
    return None
