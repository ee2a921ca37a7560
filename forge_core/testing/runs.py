"""Helpers for a plugin's own tests that need the registries or a short training run,
so that tests import the kit, never trainer internals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def registered_spec(kind: str, name: str, extra_plugins: Sequence[tuple[str, Any]] = ()) -> Any:
    """The spec registered as ``name`` in registry ``kind`` (``"packer"``, ``"model"``,
    ...) by the installed plugins (and ``extra_plugins``, ``(name, plugin)`` pairs
    registered for this call only); an unknown name is a ForgeError listing the
    registered ones."""
    from forge_core.registry import load_registries

    return load_registries(extra=tuple(extra_plugins))[kind].get(name)


def train_in_process(
    config_path: str, overrides: Sequence[str] = (), extra_plugins: Sequence[tuple[str, Any]] = ()
) -> str:
    """Train ``config_path`` (with dotted ``overrides``) in this process, exactly as
    ``forge-run`` would on one process; returns ``"completed"`` or ``"interrupted"``
    and raises ForgeError for what ``forge-run`` reports as a user error."""
    from forge_core.cli.train import train

    return train(config_path, tuple(overrides), extra_plugins=tuple(extra_plugins))


def run_context(
    out_dir: str,
    *,
    total_steps: int = 1,
    start_step: int = 0,
    rank: int = 0,
    world_size: int = 1,
    config: Any = None,
) -> Any:
    """A :class:`~forge_core.api.RunContext` for calling a logger's lifecycle hooks
    directly: the default config (or ``config``), the given run directory and steps."""
    from forge_core.api import RunContext
    from forge_core.config.schema import ForgeConfig

    return RunContext(
        config=ForgeConfig() if config is None else config,
        out_dir=str(out_dir),
        start_step=start_step,
        total_steps=total_steps,
        rank=rank,
        world_size=world_size,
    )
