"""``forge-run`` in the test's own process: :func:`forge_run` calls
:func:`forge_core.cli.main` with stdout and stderr captured, and returns what a
subprocess would have given (exit status, both streams) in milliseconds instead of the
seconds a fresh interpreter takes to start and import its plugins.

Whatever the call changes for itself is undone when it returns: environment variables
given in ``env``, the working directory, and the directories of ``paths`` put in front
of ``sys.path`` (a fake installed distribution, say) together with every module
imported from them, so the next call finds its own copy. What cannot be undone in
process (signals sent to the process, a torchrun launch, the exit status of a process
killed by a signal) still needs a real ``forge-run`` process.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from forge_core.api.unstable import environment


@attrs.frozen
class CliResult:
    """What one ``forge-run`` command gave: its exit status and both output streams."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout then stderr, for an assertion message."""
        return self.stdout + self.stderr


def _under(module: object, roots: Sequence[Path]) -> bool:
    file = getattr(module, "__file__", None)
    if not file:
        return False
    path = Path(file).resolve()
    return any(path.is_relative_to(root) for root in roots)


@contextlib.contextmanager
def _import_paths(paths: Sequence[str | os.PathLike[str]]) -> Iterator[None]:
    if not paths:
        yield
        return
    roots = [Path(p).resolve() for p in paths]
    saved = list(sys.path)
    sys.path[:0] = [str(root) for root in roots]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved
        for name in [name for name, module in sys.modules.items() if _under(module, roots)]:
            del sys.modules[name]
        importlib.invalidate_caches()


@contextlib.contextmanager
def _directory(cwd: str | os.PathLike[str] | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    before = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


def forge_run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str | None] | None = None,
    paths: Sequence[str | os.PathLike[str]] = (),
    cwd: str | os.PathLike[str] | None = None,
) -> CliResult:
    """Run ``forge-run *argv`` in this process and return its :class:`CliResult`.

    ``env``: environment variables for this call (``None`` unsets one); ``paths``:
    directories put in front of ``sys.path`` for this call, where the entry points of a
    distribution installed there are found (what ``PYTHONPATH`` does for a subprocess);
    ``cwd``: the working directory of the call. An argparse refusal, ``--help`` and
    ``--version`` give their exit status like the command does, not a ``SystemExit``.
    """
    from forge_core import cli

    out, err = io.StringIO(), io.StringIO()
    with (
        environment(env or {}),
        _import_paths(paths),
        _directory(cwd),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = cli.main([os.fspath(arg) for arg in argv])
        except SystemExit as stop:  # argparse: usage errors (2), --help and --version (0)
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
    return CliResult(code=code, stdout=out.getvalue(), stderr=err.getvalue())
