"""``forge-run CONFIG`` / ``forge-run train``: judge the config, then train.

- The config is judged first, exactly as ``forge-run check`` does, against the world
  size the run will have; an invalid config is refused with the same report before any
  process group or tensor exists. Warnings are printed and the run goes on.
- One process by default. ``--nproc N`` re-launches through
  ``python -m torch.distributed.run --nproc-per-node N ... -m forge_core.train.worker``
  (``--nnodes``, ``--node-rank``, ``--rdzv-endpoint`` passed through).
- Started by ``torchrun`` directly (``RANK``/``WORLD_SIZE`` set), it trains in this
  process as one rank of the group.

:func:`train` is the in-process entry point (tests, notebooks): it accepts extra
plugins registered for this run only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from forge_core.api import ForgeError
from forge_core.parallel_dims import launched_by_torchrun


class InvalidConfig(ForgeError):
    """The rule engine found errors; the message is ``forge-run check``'s report."""


def judged(config_path: str, overrides: Sequence[str], world_size: int | None,
           extra_plugins: Sequence[tuple[str, Any]] = (), *, quiet: bool = False) -> Any:
    """Judge the config; raise :class:`InvalidConfig` with the report on errors and print
    warnings (unless ``quiet``) otherwise."""
    from forge_core.judge import judge
    from forge_core.rules import render

    result = judge(config_path, list(overrides), world_size, tuple(extra_plugins))
    if result.errors:
        raise InvalidConfig(
            f"{render(result.violations)}\n{config_path}: invalid: {len(result.errors)} error(s), "
            f"{len(result.warnings)} warning(s); refusing to train (world size {world_size}). "
            f"`forge-run check {config_path}` prints the same report."
        )
    if result.warnings and not quiet:
        print(render(result.warnings), file=sys.stderr, flush=True)
    return result


def train(config_path: str, overrides: Sequence[str] = (), *,
          extra_plugins: Sequence[tuple[str, Any]] = ()) -> str:
    """Train in this process (one rank of a torchrun group when launched by one).
    Returns ``"completed"`` or ``"interrupted"``; raises ForgeError on user errors."""
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1
    rank = int(os.environ.get("RANK", "0"))
    # Judge before importing torch: an invalid config is refused in a fraction of a second.
    result = judged(config_path, overrides, world_size, extra_plugins, quiet=rank != 0)
    from forge_core.train import distributed
    from forge_core.train.trainer import Trainer

    placement = distributed.setup(result.config.run.device)
    try:
        return Trainer(result.config, result.registries, placement).run()
    finally:
        distributed.teardown()


def _nnodes_count(nnodes: str | None) -> int | None:
    if nnodes is None:
        return 1
    text = str(nnodes)
    if text.isdigit():
        return int(text)
    low, _, high = text.partition(":")
    return int(low) if low.isdigit() and low == high else None  # elastic range: unknown


def torchrun_command(args: Any, overrides: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc)]
    if args.nnodes is not None:
        cmd += ["--nnodes", str(args.nnodes)]
    if args.node_rank is not None:
        cmd += ["--node-rank", str(args.node_rank)]
    if args.rdzv_endpoint:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
    elif args.nnodes is None:
        cmd += ["--standalone"]
    return cmd + ["-m", "forge_core.train.worker", args.config, *overrides]


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(x) for x in f.read().split())
    except OSError:
        return []
    return found


def relaunch(args: Any, overrides: Sequence[str]) -> int:
    """Run torchrun as a child in its own session. SIGTERM and SIGINT (Ctrl-C) sent to
    ``forge-run`` are passed to the workers themselves, which save a checkpoint at the
    next step boundary and exit 0, so torchrun ends cleanly too. (Signalling torchrun
    would make its agent tear the workers down and exit with an error.)"""
    child = subprocess.Popen(torchrun_command(args, overrides), start_new_session=True)

    def forward(signum: int, frame: Any) -> None:
        workers = _children(child.pid)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if not workers:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(args: Any) -> int:
    overrides = list(args.overrides)
    if getattr(args, "device", None):
        overrides.append(f"run.device={args.device}")
    nproc = int(getattr(args, "nproc", 1) or 1)
    if launched_by_torchrun():
        if nproc > 1 and os.environ.get("RANK") == "0":
            print("warning: --nproc is ignored under torchrun (it already started the processes)",
                  file=sys.stderr)
        train(args.config, overrides)
        return 0
    nnodes = getattr(args, "nnodes", None)
    if nproc > 1 or (nnodes is not None and _nnodes_count(nnodes) != 1):
        count = _nnodes_count(nnodes)
        judged(args.config, overrides, None if count is None else nproc * count)
        return relaunch(args, overrides)
    train(args.config, overrides)
    return 0
