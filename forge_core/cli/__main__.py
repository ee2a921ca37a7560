"""``python -m forge_core.cli ...``: the same as ``forge-run ...``."""

import sys

from forge_core.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
