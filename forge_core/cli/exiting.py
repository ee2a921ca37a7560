"""How a ``forge-run`` process ends: :func:`exit_process`, for the ``__main__`` blocks of
the processes a command starts (``python -m forge_core.cli``, the torchrun agent, each
worker), never for ``main()`` called in someone else's process.

A process that imported torch spends about 0.4 s of CPU (over a second of wall time on
a busy machine) in the interpreter's shutdown, where the cyclic garbage collector walks
the hundreds of thousands of objects torch created at import, once per pass over the
modules. ``forge-run --nproc N`` waits for that in N workers and the agent before it
returns. Collecting once and then freezing what is left (``gc.freeze``: the collector
skips those objects from then on) ends the process without that walk. The shutdown
itself is unchanged: threads are joined, atexit handlers run, objects freed by
reference counting are finalized; garbage collected before the freeze is finalized too
(a file in a reference cycle is flushed and closed). Only objects still alive at the
freeze that become cyclic garbage during the shutdown are not finalized; their memory
goes back to the operating system with the process.
"""

from __future__ import annotations

import gc
import sys


def exit_process(code: int | None) -> None:
    """End this process with exit status ``code`` (``sys.exit`` semantics), skipping the
    garbage collector's walk over what is alive at the end."""
    gc.collect()
    gc.freeze()
    sys.exit(code)
