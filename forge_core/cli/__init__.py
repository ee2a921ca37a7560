"""``forge-run``: every command in one package.

:mod:`~forge_core.cli.main` parses the command line and runs the command's handler; the
torch-free commands (``check``, ``plugins``, ``rules``, ``show``) live in
:mod:`~forge_core.cli.describe`, and each command that builds something has a module of
its own (``train``, with its torchrun ``agent`` and ``worker``; ``prepare``,
``export``, ``sample``, ``eval``), imported only when that command runs."""

from forge_core.cli.main import main

__all__ = ["main"]
