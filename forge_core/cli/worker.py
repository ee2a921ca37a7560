"""One training process under ``torch.distributed.run``:
``python -m forge_core.cli.worker CONFIG [key=value ...]``.

``forge-run --nproc N`` starts N of these; each judges the config again (cheap, and the
world size is now known from the environment) and trains as one rank.

- It ends with its agent: when the agent dies, even by SIGKILL, the kernel sends it
  SIGTERM, and it saves a checkpoint at the next step boundary and stops
  (:func:`~forge_core.train.signals.end_with_parent`).
- Exit status: 0 when training completed or was stopped by a signal after saving (the
  agent must not take a clean stop for a failure), otherwise the error's status (2 bad
  input, 124 a collective timed out, 128 + N interrupted by signal N before training,
  1 anything else).
- Its error message goes to the error file torchrun names (``TORCHELASTIC_ERROR_FILE``),
  which ``forge-run``'s agent prints once for all ranks. Under a plain ``torchrun`` it is
  printed as well: once, by rank 0, for the config's own errors (every rank finds the
  same), by every rank that hits it otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from forge_core.cli.agent import AGENT_PID_ENV
from forge_core.cli.exiting import exit_process
from forge_core.errors import Interrupted, outcome, show_tracebacks, traceback_text
from forge_core.train.signals import end_with_parent

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def _write_error_file(message: str) -> bool:
    """Leave ``message`` where the agent reads a failed worker's reason."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return False
    try:
        with open(path, "w") as f:
            json.dump({"message": message, "timestamp": int(time.time())}, f)
    except OSError:
        return False
    return True


def _fail(message: str, code: int, *, same_on_every_rank: bool) -> int:
    rank = os.environ.get("RANK", "0")
    written = _write_error_file(message)
    if not (written and os.environ.get(AGENT_PID_ENV)) and (rank == "0" or not same_on_every_rank):
        prefix = "" if rank == "0" else f"[rank {rank}] "
        print(f"{prefix}{message}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m forge_core.cli.worker CONFIG [key=value ...]", file=sys.stderr)
        return 2
    end_with_parent(signal.SIGTERM, int(os.environ.get(AGENT_PID_ENV, "0") or 0) or None)
    from forge_core.cli.train import InvalidConfig, run_here
    from forge_core.config.errors import ConfigError

    try:
        return run_here(argv[0], argv[1:])
    except (Exception, KeyboardInterrupt, Interrupted) as exc:
        message, code = outcome(exc)
        if message is None:
            return code
        if show_tracebacks() and not isinstance(exc, Interrupted):
            print(traceback_text(exc), end="", file=sys.stderr)
        same = isinstance(exc, (ConfigError, InvalidConfig, Interrupted))
        return _fail(message, code, same_on_every_rank=same)


if __name__ == "__main__":
    exit_process(main())
