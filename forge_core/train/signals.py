"""How a run's processes stop: SIGTERM/SIGINT handling, and ending with a parent.

- :class:`StopSignal`: installed before anything is built. During start-up (judging,
  importing torch, joining the process group, building data and model, resuming) a
  SIGTERM or SIGINT stops the process at once with :class:`~forge_core.errors.Interrupted`
  (nothing was trained, nothing is saved); once training, it only sets a flag and the loop
  saves a checkpoint at the next step boundary. The run's ``run.requeue_signal`` (the
  signal a scheduler sends before the time limit, ``USR1``) is added once the config is
  read (:meth:`StopSignal.also`) and takes the same path.
- :func:`end_with_parent`: on Linux, ask the kernel to send this process a signal when its
  parent dies (``PR_SET_PDEATHSIG``), so that killing ``forge-run`` or the torchrun agent,
  even with SIGKILL, ends the processes it started instead of leaving them training.

Imports nothing heavy: ``forge-run`` installs it before torch is imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Any

from forge_core.errors import Interrupted

_PR_SET_PDEATHSIG = 1


class StopSignal:
    """SIGTERM/SIGINT (and :meth:`also`): :class:`Interrupted` during start-up, a flag
    once training.

    A context manager that may be entered more than once (by ``train()`` and by the
    trainer); handlers are installed from the main thread only, by the outermost entry,
    and restored when it exits."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.training = False
        self.signals: tuple[int, ...] = self.SIGNALS
        self._previous: dict[int, Any] = {}
        self._depth = 0
        self._installs = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum
        if not self.training:
            raise Interrupted(signum)

    def start_training(self) -> None:
        """From now on a signal sets the flag the loop acts on at a step boundary."""
        self.training = True

    def also(self, signum: int) -> None:
        """Stop on ``signum`` too, like SIGTERM; installed at once when the handlers are."""
        if signum in self.signals:
            return
        self.signals += (signum,)
        if self._installs:
            self._previous[signum] = signal.signal(signum, self._handler)

    def __enter__(self) -> StopSignal:
        if self._depth == 0 and threading.current_thread() is threading.main_thread():
            self._installs = True
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handler)
        self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        self._installs = False


def signal_number(name: str) -> int | None:
    """The number of a signal named without its ``SIG`` (``run.requeue_signal``); ``None``
    for '' or a signal this platform lacks."""
    return int(getattr(signal, f"SIG{name}")) if name and hasattr(signal, f"SIG{name}") else None


def end_with_parent(signum: int = signal.SIGTERM, expected_parent: int | None = None) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux only;
    returns whether it could). When ``expected_parent`` is given and is no longer the
    parent, the parent already died: the signal is sent at once."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent and os.getppid() != expected_parent:
        os.kill(os.getpid(), signum)
    return True


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``; empty elsewhere or once it is gone)."""
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(x) for x in f.read().split())
    except OSError:
        return []
    return found


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``T`` stopped, ``Z``
    ended, ...), or ``None`` when it is gone or this is not Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended)."""
    return process_state(pid) not in (None, "Z", "X")
