"""Deprecated: the training worker is ``python -m forge_core.cli.worker``.

Kept for one release so that ``torchrun ... -m forge_core.train.worker CONFIG`` still
trains: it says where the worker moved, once per run (rank 0), and runs it."""

import os
import runpy
import sys

if __name__ == "__main__":
    if os.environ.get("RANK", "0") == "0":
        print(
            "warning: `-m forge_core.train.worker` is deprecated; use `-m forge_core.cli.worker` "
            "(same arguments)",
            file=sys.stderr,
            flush=True,
        )
    runpy.run_module("forge_core.cli.worker", run_name="__main__", alter_sys=True)
