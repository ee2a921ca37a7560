"""``forge-run CONFIG`` / ``forge-run train``: judge the config, then train.

- What the chosen components name elsewhere (a model by Hub id) is fetched first
  (``ComponentSpec.fetch``; ``check`` never downloads). Then the config is judged,
  exactly as ``forge-run check`` does, against the world size the run will have; an
  invalid config is refused with the same report (and the exact ``forge-run check``
  command that prints it) before any process group or tensor exists. Warnings are
  printed and the run goes on.
- One process by default. ``--nproc N`` starts :mod:`forge_core.cli.agent` (torchrun's
  agent, same options) which starts N :mod:`forge_core.cli.worker` processes
  (``--nnodes``, ``--node-rank``, ``--rdzv-endpoint`` passed through).
- Started by ``torchrun`` directly (``RANK``/``WORLD_SIZE`` set), it trains in this
  process as one rank of the group.
- Started by Slurm's ``srun`` as one task of a step (``srun forge-run train CONFIG``,
  one task per process), it takes its rank, the world size and the rendezvous from
  ``SLURM_*`` (:mod:`forge_core.cli.slurm`) and trains as that rank; a stop by signal
  exits 128 + the signal on every task.

Stopping: SIGTERM/SIGINT, and ``run.requeue_signal`` (USR1 unless the config says
otherwise), save a checkpoint at the next step boundary (before training starts they stop
at once, nothing saved) and ``forge-run`` exits 128 + the signal (138 for USR1: a batch
script's trap requeues the job on it, see docs/multi-node.md). Under ``--nproc`` they are
passed to the workers themselves. Killing ``forge-run``, even with
SIGKILL, makes the kernel send SIGTERM to the agent, which stops its workers the same
way; killing the agent does the same to its workers (:func:`~forge_core.train.signals.end_with_parent`).

:func:`train` is the in-process entry point (tests, notebooks): it accepts extra
plugins registered for this run only.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from forge_core.api import ForgeError
from forge_core.cli import slurm
from forge_core.errors import (
    EXIT_OK,
    exit_for_signal,
    signal_name,
)
from forge_core.parallel_dims import count_problem, launched_by_torchrun, torchrun_place
from forge_core.train.signals import StopSignal, alive, child_pids, signal_number

if TYPE_CHECKING:
    from forge_core.registry import Registries

#: Set by ``forge-run`` for its agent, which checks it is still its parent.
LAUNCHER_PID_ENV = "FORGE_LAUNCHER_PID"
#: How long ``forge-run`` waits for the workers of a killed agent to save and stop.
ORPHAN_WAIT_S = 120.0
#: Set by ``forge-run --nproc`` for its agent: the number of ``run.requeue_signal``, which
#: the agent ignores (a scheduler may signal every process of the step; the workers stop
#: on it, the agent must not die of it first).
REQUEUE_SIGNAL_ENV = "FORGE_REQUEUE_SIGNAL"


class InvalidConfig(ForgeError):
    """The rule engine found errors; the message is ``forge-run check``'s report."""


def check_command(config_path: str, overrides: Sequence[str], world_size: int | None) -> str:
    """The ``forge-run check`` command that judges exactly what a run judged."""
    words = ["forge-run", "check", config_path, *overrides]
    if world_size is not None:
        words += ["--world-size", str(world_size)]
    return shlex.join(words)


def fetch_remote(
    config_path: str, overrides: Sequence[str], extra_plugins: Sequence[tuple[str, Any]] = ()
) -> None:
    """Call the ``fetch`` of each chosen component that declares one
    (:class:`~forge_core.api.ComponentSpec`), so that what the options name elsewhere (a
    Hub id) is here before the config is judged. A config that does not load is left
    to the judge, which reports every problem of it."""
    from forge_core.api import import_path
    from forge_core.api.unstable import get_path
    from forge_core.config.schema import OPTION_BLOCKS
    from forge_core.resolve import load_resolved

    try:
        config, registries = load_resolved(config_path, list(overrides), tuple(extra_plugins))
    except ForgeError:
        return
    for block in OPTION_BLOCKS:
        spec = registries[block.name].get(get_path(config, block.name_path))
        if spec.fetch:
            import_path(spec.fetch)(get_path(config, block.options_path))


def judged(
    config_path: str,
    overrides: Sequence[str],
    world_size: int | None,
    extra_plugins: Sequence[tuple[str, Any]] = (),
    *,
    quiet: bool = False,
) -> Any:
    """Judge the config; raise :class:`InvalidConfig` with the report on errors and print
    warnings (unless ``quiet``) otherwise."""
    from forge_core.cli.report import render
    from forge_core.judge import judge

    fetch_remote(config_path, overrides, extra_plugins)
    result = judge(config_path, list(overrides), world_size, tuple(extra_plugins))
    if result.errors:
        raise InvalidConfig(
            f"{render(result.violations)}\n{config_path}: invalid: {len(result.errors)} error(s), "
            f"{len(result.warnings)} warning(s); refusing to train (world size {world_size}). "
            f"`{check_command(config_path, overrides, world_size)}` prints the same report."
        )
    if result.warnings and not quiet:
        print(render(result.warnings), file=sys.stderr, flush=True)
    return result


def train(
    config_path: str,
    overrides: Sequence[str] = (),
    *,
    extra_plugins: Sequence[tuple[str, Any]] = (),
    stop: StopSignal | None = None,
) -> str:
    """Train in this process (one rank of a torchrun group when launched by one).
    Returns ``"completed"`` or ``"interrupted"`` (``stop.received`` says by which signal);
    raises ForgeError on user errors, :class:`~forge_core.errors.Interrupted` when a
    signal arrived before training began."""
    stop = stop or StopSignal()
    with stop:  # from the first moment: a signal during start-up stops cleanly
        rank, world_size, _ = torchrun_place()
        # Judge before importing torch: an invalid config is refused in a fraction of a second.
        result = judged(config_path, overrides, world_size, extra_plugins, quiet=rank != 0)
        if (requeue := signal_number(result.config.run.requeue_signal)) is not None:
            stop.also(requeue)
        from forge_core.distributed import placement as distributed
        from forge_core.train.trainer import Trainer

        placement = distributed.setup(result.config.run.device, result.config.run.collective_timeout)
        try:
            outcome = Trainer(result.plan, result.registries, placement, stop=stop).run()
            # Tells a rank stopped by its peers' signal which one it was.
            received = distributed.all_reduce_max([float(stop.received or 0)], placement.device)[0]
            if outcome == "interrupted" and stop.received is None and received:
                stop.received = int(received)
            # Every rank leaves its last collective before any rank closes the group: a
            # peer that tears down gloo while another still completes work can abort it
            # ("terminate called without an active exception"). gloo's barrier, unlike an
            # all-reduce, first waits for the group's pending work (a pipeline's last sends).
            distributed.barrier()
            return outcome
        except (ForgeError, BrokenPipeError):
            raise
        except Exception as exc:
            explained = explain_failure(exc, result.registries, placement)
            if explained is None:
                raise
            raise explained from exc
        finally:
            distributed.teardown()


def explain_failure(exc: Exception, registries: Registries, placement: Any) -> ForgeError | None:
    """A clean error for an exception that escaped the run: a collective that timed out or
    lost its peer, or plugin code (named with its component and plugin); ``None`` for the
    kernel's own failures, which are bugs."""
    from forge_core import components
    from forge_core.distributed import placement as distributed

    collective = distributed.collective_failure(exc, placement)
    if collective is not None:
        return collective
    who = components.culprit(exc, registries)
    return None if who is None else components.failure(exc, who)


def run_here(config_path: str, overrides: Sequence[str], *, srun_task: bool = False) -> int:
    """Train in this process; the exit status. Interrupted and saved: 128 + the signal
    alone or as an srun task (srun returns the highest of its tasks' statuses, which the
    batch script's trap reads), 0 as a torchrun worker (its agent must not take a clean
    stop for a failure: the launcher knows which signal it passed on)."""
    stop = StopSignal()
    status = train(config_path, overrides, stop=stop)
    by_signal = srun_task or not launched_by_torchrun()
    if status == "interrupted" and stop.received is not None and by_signal:
        return exit_for_signal(stop.received)
    return EXIT_OK


def _nnodes_count(nnodes: str | None) -> int | None:
    if nnodes is None:
        return 1
    text = str(nnodes)
    if count_problem(text, 1) is None:
        return int(text)
    low, _, high = text.partition(":")
    return int(low) if count_problem(low, 1) is None and low == high else None  # elastic range: unknown


def torchrun_command(args: Any, overrides: Sequence[str]) -> list[str]:
    """The agent's command line: torchrun's options, then the worker and its arguments."""
    cmd = [sys.executable, "-m", "forge_core.cli.agent", "--nproc-per-node", str(args.nproc)]
    if args.nnodes is not None:
        cmd += ["--nnodes", str(args.nnodes)]
    if args.node_rank is not None:
        cmd += ["--node-rank", str(args.node_rank)]
    if args.rdzv_endpoint:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
    elif args.nnodes is None:
        cmd += ["--standalone"]
    return cmd + ["-m", "forge_core.cli.worker", args.config, *overrides]


def relaunch(args: Any, overrides: Sequence[str], requeue: int | None = None) -> int:
    """Run the agent as a child in its own session (so a Ctrl-C in the terminal reaches
    ``forge-run`` alone). SIGTERM and SIGINT (and the ``requeue`` signal) sent to
    ``forge-run`` are passed to the workers themselves, which save a checkpoint at the
    next step boundary and exit 0, so the agent ends cleanly too; ``forge-run`` then exits
    128 + the signal. (Signalling the agent would make it tear the workers down.) When
    the agent is killed, its workers are told to stop by the kernel: ``forge-run`` waits
    for them and exits 128 + the agent's signal."""
    env = {**os.environ, LAUNCHER_PID_ENV: str(os.getpid())}
    if requeue is not None:
        env[REQUEUE_SIGNAL_ENV] = str(requeue)
    child = subprocess.Popen(torchrun_command(args, overrides), start_new_session=True, env=env)
    received: list[int] = []
    workers: set[int] = set()

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        current = child_pids(child.pid)
        for pid in current:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        if not current:  # no worker yet: the agent stops (and exits 128 + signum)
            # It ignores the requeue signal (see REQUEUE_SIGNAL_ENV): it stops on SIGTERM.
            child.send_signal(signal.SIGTERM if signum == requeue else signum)

    passed = (signal.SIGTERM, signal.SIGINT) + ((requeue,) if requeue is not None else ())
    previous = {sig: signal.signal(sig, forward) for sig in passed}
    try:
        while True:
            try:
                code = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                workers.update(child_pids(child.pid))  # known even after the agent is gone
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code < 0:
        survivors = [pid for pid in workers if alive(pid)]
        print(
            f"error: the torchrun agent (pid {child.pid}) was killed by {signal_name(-code)}"
            + (f"; waiting for its {len(survivors)} worker(s) to save and stop" if survivors else ""),
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while survivors and time.monotonic() < deadline:
            time.sleep(0.2)
            survivors = [pid for pid in survivors if alive(pid)]
        if survivors:
            print(
                f"error: worker(s) {', '.join(map(str, survivors))} still running after {ORPHAN_WAIT_S:g} s",
                file=sys.stderr,
            )
        return exit_for_signal(-code)
    if received and (code == 0 or (received[0] == requeue and code == exit_for_signal(signal.SIGTERM))):
        return exit_for_signal(received[0])
    return code


def main(args: Any) -> int:
    overrides = list(args.overrides)
    if getattr(args, "device", None):
        overrides.append(f"run.device={args.device}")
    nproc = int(getattr(args, "nproc", 1) or 1)
    nnodes = getattr(args, "nnodes", None)
    launcher = nproc > 1 or nnodes is not None  # forge-run starts the node's processes
    if not launcher:
        with slurm.adopted(os.environ) as task:
            if task is not None:
                if task.rank == 0:
                    print(
                        f"forge: srun task 0 of {task.world_size} (Slurm job {task.job_id or '?'}): "
                        f"rendezvous at {task.master_addr}:{task.master_port}",
                        file=sys.stderr,
                        flush=True,
                    )
                return run_here(args.config, overrides, srun_task=True)
    if not launcher and (tasks := slurm.allocation_tasks(os.environ)):
        print(
            f"warning: this Slurm job ({os.environ['SLURM_JOB_ID']}) has {tasks} tasks, but forge-run "
            "was not started by srun: training as one process. `srun forge-run ...` starts one per "
            "task (docs/multi-node.md)",
            file=sys.stderr,
        )
    if launched_by_torchrun():
        if nproc > 1 and os.environ.get("RANK") == "0":
            print(
                "warning: --nproc is ignored under torchrun (it already started the processes)",
                file=sys.stderr,
            )
        return run_here(args.config, overrides)
    if nproc > 1 or (nnodes is not None and _nnodes_count(nnodes) != 1):
        count = _nnodes_count(nnodes)
        result = judged(args.config, overrides, None if count is None else nproc * count)
        return relaunch(args, overrides, signal_number(result.config.run.requeue_signal))
    return run_here(args.config, overrides)
