"""One training process under ``torch.distributed.run``:
``python -m forge_core.train.worker CONFIG [key=value ...]``.

``forge-run --nproc N`` starts N of these; each judges the config again (cheap, and the
world size is now known from the environment) and trains as one rank. A user error
(ForgeError) is printed once, by rank 0, and exits 2.
"""

from __future__ import annotations

import os
import sys

from forge_core.api import ForgeError
from forge_core.errors import EXIT_INVALID, format_error


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m forge_core.train.worker CONFIG [key=value ...]", file=sys.stderr)
        return EXIT_INVALID
    from forge_core.train.launch import train

    try:
        train(argv[0], argv[1:])
    except ForgeError as exc:
        if os.environ.get("RANK", "0") == "0":
            print(format_error(exc), file=sys.stderr)
        return EXIT_INVALID
    return 0


if __name__ == "__main__":
    sys.exit(main())
