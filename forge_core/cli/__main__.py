"""``python -m forge_core.cli ...``: the same as ``forge-run ...``."""

from forge_core.cli.exiting import exit_process
from forge_core.cli.main import main

if __name__ == "__main__":
    exit_process(main())
