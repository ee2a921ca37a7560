"""The torchrun agent as ``forge-run --nproc N`` runs it:
``python -m forge_core.cli.agent [torchrun options] -m forge_core.cli.worker CONFIG ...``.

It is torchrun itself (same options, same rendezvous, same worker environment), with:

- its life tied to ``forge-run``: when ``forge-run`` dies, even by SIGKILL, the kernel
  sends this agent SIGTERM and it stops its workers (they save a checkpoint at the next
  step boundary); its workers are tied to it the same way (see the worker);
- a report instead of torchrun's traceback when workers fail: each distinct message the
  workers left (a worker writes it to the error file torchrun gives it, instead of
  printing it once per rank), which ranks were killed by a signal, and which had been
  stopped (SIGSTOP, a debugger) and so stopped answering;
- an exit status that says what happened (docs/cli.md): 2 bad input, 124 a collective
  timed out or a worker was found stopped, 128 + N a worker killed by signal N (or the
  run interrupted by it before training), 1 anything else.

A :class:`WorkerWatch` thread looks at the workers' states twice a second; once one has
ended while another is stopped, the stopped one is continued (SIGCONT) so that it sees
the job is over and ends, instead of waiting for the agent's SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from forge_core.cli.exiting import exit_process
from forge_core.cli.train import LAUNCHER_PID_ENV, REQUEUE_SIGNAL_ENV
from forge_core.errors import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_TIMEOUT,
    TRACEBACK_ENV,
    Interrupted,
    exit_for_signal,
    show_tracebacks,
    signal_name,
    traceback_text,
    where_raised,
)
from forge_core.train.signals import alive, child_pids, end_with_parent, process_state

#: Set for the workers: the pid of their agent, so a worker can tell it was orphaned early.
AGENT_PID_ENV = "FORGE_AGENT_PID"
_INTERRUPTED = {
    exit_for_signal(signal.SIGINT),
    exit_for_signal(signal.SIGTERM),
    -signal.SIGINT,
    -signal.SIGTERM,
}


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"RANK="):
                    return int(item[5:])
    except (OSError, ValueError):
        pass
    return None


class WorkerWatch(threading.Thread):
    """This agent's workers, as the kernel sees them: rank by pid, and since when each
    has been stopped (state ``T``)."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(name="forge-worker-watch", daemon=True)
        self.interval = interval
        self.ranks: dict[int, int] = {}
        self.stopped_since: dict[int, float] = {}
        self.ended: set[int] = set()
        self.lock = threading.Lock()

    def poll(self) -> None:
        with self.lock:
            for pid in child_pids(os.getpid()):
                if pid not in self.ranks and (rank := _rank_of(pid)) is not None:
                    self.ranks[pid] = rank
            for pid in self.ranks:
                state = process_state(pid)
                if not alive(pid):
                    self.ended.add(pid)
                elif state == "T":
                    self.stopped_since.setdefault(pid, time.time())
                elif pid in self.stopped_since and state != "t" and not self.ended:
                    del self.stopped_since[pid]  # continued while the job still ran
            if self.ended:
                # The job is ending: a stopped worker would only wait for the agent's SIGKILL.
                for pid in set(self.stopped_since) - self.ended:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass

    def was_stopped(self, pid: int) -> float | None:
        with self.lock:
            return self.stopped_since.get(pid)

    def run(self) -> None:
        while True:
            self.poll()
            time.sleep(self.interval)


def _signum(code: int) -> int:
    """The signal of an exit code: ``-N`` (killed) or ``128 + N`` (stopped cleanly by it)."""
    return -code if code < 0 else code - 128


def _message(failure: Any) -> str | None:
    """What the worker wrote to its error file (Forge's plain string, or the structure
    torch's ``@record`` writes), else ``None``."""
    if not os.path.isfile(str(getattr(failure, "error_file", ""))):
        return None  # torch fills in a placeholder
    message = (getattr(failure, "error_file_data", None) or {}).get("message")
    if isinstance(message, dict):
        message = message.get("message")
    return message if isinstance(message, str) and message.strip() else None


def report(failures: dict[int, Any], watch: WorkerWatch) -> int:
    """Print what happened to the failed workers (by global rank); the exit status."""
    by_message: dict[str, list[int]] = {}
    notes: list[str] = []
    killed: list[int] = []
    for rank, failure in sorted(failures.items()):
        code, pid = failure.exitcode, failure.pid
        since = watch.was_stopped(pid)
        # A stopped worker's own complaint (its collective timed out while it was stopped)
        # says nothing the note below does not.
        message = _message(failure) if since is None else None
        if message is not None:
            by_message.setdefault(message, []).append(rank)
        if since is not None:
            notes.append(
                f"error: rank {rank} (pid {pid}) had been stopped (SIGSTOP, or a debugger) since "
                f"{time.strftime('%H:%M:%S', time.localtime(since))}: it is the process that "
                f"stopped answering"
            )
        elif code < 0 and -code != signal.SIGTERM:  # SIGTERM: the agent ending the others
            killed.append(-code)
            oom = (
                " (the kernel's out-of-memory killer sends SIGKILL: see `dmesg`)"
                if -code == signal.SIGKILL
                else ""
            )
            notes.append(f"error: rank {rank} (pid {pid}) was killed by {signal_name(-code)}{oom}")
        elif message is None and code > 0 and code not in _INTERRUPTED:
            notes.append(f"error: rank {rank} (pid {pid}) exited with status {code} and no message")
    for message, ranks in by_message.items():
        prefix = (
            ""
            if len(by_message) == 1
            else f"[rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}] "
        )
        print(f"{prefix}{message}", file=sys.stderr)
    for note in notes:
        print(note, file=sys.stderr)
    sys.stderr.flush()
    codes = [f.exitcode for f in failures.values()]
    if EXIT_INVALID in codes:
        return EXIT_INVALID
    # A stopped rank is the story however the others ended (gloo raises a timeout; NCCL's
    # watchdog aborts the process).
    if EXIT_TIMEOUT in codes or any(watch.was_stopped(f.pid) for f in failures.values()):
        return EXIT_TIMEOUT
    if killed:
        return exit_for_signal(killed[0])
    if codes and all(c in _INTERRUPTED for c in codes):
        return exit_for_signal(_signum(codes[0]))
    return EXIT_FAILED


def _quiet_torch_logs() -> None:
    """torchrun's own log (banners, teardown steps, its failure summary) says what the
    report says; keep it for ``FORGE_TRACEBACK=1``."""
    if show_tracebacks():
        return
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(
            ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")
        ):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher = int(os.environ.get(LAUNCHER_PID_ENV, "0") or 0)
    end_with_parent(signal.SIGTERM, launcher or None)
    os.environ[AGENT_PID_ENV] = str(os.getpid())
    if (requeue := os.environ.get(REQUEUE_SIGNAL_ENV, "")).isdigit():
        # The workers stop on it (and inherit the ignoring until they install their handler).
        signal.signal(int(requeue), signal.SIG_IGN)
    # Until torch's agent installs its own handlers, a signal simply ends the agent.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    watch = WorkerWatch()
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        _quiet_torch_logs()
        watch.start()
        try:
            run(parse_args(argv))
        except ChildFailedError as exc:
            watch.poll()
            return report(exc.failures, watch)
        except SignalException as exc:
            return exit_for_signal(exc.sigval)
    except Interrupted as exc:
        print(f"forge: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # rendezvous, network, bad torchrun options
        if show_tracebacks():
            print(traceback_text(exc), end="", file=sys.stderr)
        print(
            f"error: the torchrun agent failed: {type(exc).__name__}: {exc} (at {where_raised(exc)}; "
            f"{TRACEBACK_ENV}=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    exit_process(main())
