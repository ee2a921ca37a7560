"""Exit statuses, the kernel's own errors, and how a command reports what ended it.

A :class:`~forge_core.api.ForgeError`'s message is the whole story: the CLI prints it
without a traceback and exits with its ``exit_code`` (2, bad input, unless a subclass
says otherwise). Anything else that escapes is described in one line
(:func:`describe_unexpected`); the traceback is shown only with ``FORGE_TRACEBACK=1``.
"""

from __future__ import annotations

import os
import signal
import traceback

from forge_core.api import errors as _api
from forge_core.api.errors import EXIT_INVALID

#: Exit statuses of ``forge-run`` (documented in docs/cli.md); EXIT_INVALID (2, bad
#: input: config, files, a plugin or a component) is ForgeError's, in forge_core.api.
EXIT_OK = 0
EXIT_FAILED = 1  # an unexpected failure (a bug): one line, the traceback with FORGE_TRACEBACK=1
EXIT_TIMEOUT = 124  # a collective timed out: a process stopped answering
TRACEBACK_ENV = "FORGE_TRACEBACK"


def exit_for_signal(signum: int) -> int:
    """The shell's convention for "ended by signal N": 128 + N (130 SIGINT, 143 SIGTERM)."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def show_tracebacks() -> bool:
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


class ComponentError(_api.ForgeError):
    """Plugin code raised while a component was built or used. The message names the
    component, the plugin that registered it and the original error (kept as
    ``__cause__``)."""


class CollectiveTimeout(_api.ForgeError):
    """A collective got no answer from another process within ``run.collective_timeout``."""

    exit_code = EXIT_TIMEOUT


class ProcessLost(_api.ForgeError):
    """Another process of the job ended while this one waited for it in a collective."""

    exit_code = EXIT_FAILED


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived before training began: nothing was trained or saved.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in plugin code
    running at that moment does not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(
            f"{signal_name(signum)} received during start-up: stopped before training; "
            "nothing was trained or saved"
        )

    @property
    def exit_code(self) -> int:
        return exit_for_signal(self.signum)


def format_error(exc: _api.ForgeError) -> str:
    """The message as printed: every line of a config report already starts ``error:``."""
    message = str(exc)
    return message if message.startswith("error") else f"error: {message}"


def where_raised(exc: BaseException) -> str:
    """``file.py:123 in func``: the innermost frame of the exception's traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown location"
    last = frames[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"


def describe_unexpected(exc: BaseException) -> str:
    """One line for an exception no Forge code anticipated: what, where, and how to see more."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (
        f"error: unexpected {type(exc).__name__}{': ' + text if text else ''} "
        f"(at {where_raised(exc)}). This is a bug in Forge or in a plugin; "
        f"{TRACEBACK_ENV}=1 shows the traceback."
    )


def traceback_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def outcome(exc: BaseException) -> tuple[str | None, int]:
    """What to print (``None``: nothing) and the exit status, for an exception that ended
    a command: the one mapping the CLI, the worker and the agent share."""
    if isinstance(exc, BrokenPipeError):  # the reader of stdout went away
        return None, exit_for_signal(signal.SIGPIPE)
    if isinstance(exc, _api.ForgeError):
        return format_error(exc), exc.exit_code
    if isinstance(exc, Interrupted):
        return f"forge: {exc}", exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return None, exit_for_signal(signal.SIGINT)
    if isinstance(exc, OSError):  # a file, a permission, the disk: its message says which
        return f"error: {exc}", EXIT_INVALID
    if isinstance(exc, Exception):
        return describe_unexpected(exc), EXIT_FAILED
    raise exc  # SystemExit and the like end the process as they mean to
