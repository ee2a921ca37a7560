"""A bound on how long a test's call may take, so that a regression that makes Forge
hang (a FIFO opened for reading, a host list expanded in full) fails the test instead of
hanging the suite.

:func:`deadline` arms ``SIGALRM`` for the main thread: a blocking ``open`` of a FIFO is
interrupted (PEP 475 retries a system call only when the handler returns) and so is a
loop in Python code. A ``read`` that never blocks (``/dev/zero``) is not: bound those by
the size of what is read instead.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class DeadlineExceeded(AssertionError):
    """The call took longer than its deadline: what it guards against has come back."""


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Within: ``DeadlineExceeded`` naming ``what`` after ``seconds`` of wall time."""

    def expire(signum: int, frame: object) -> None:
        raise DeadlineExceeded(f"{what} took more than {seconds:g} s: it hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    # Then every second: code that catches the first expiry (a rule engine reporting a
    # failed rule) and blocks again is interrupted again.
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
