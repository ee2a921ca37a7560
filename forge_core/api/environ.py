"""Environment variables set for a while: :func:`environment`. What a launcher sets for
the process it runs in (an srun task's torchrun variables), what a plugin sets around a
library that reads its settings from the environment (MLflow's request bounds), and
what the kit sets around a ``forge-run`` called in process; each value is restored
after, an unset one unset again.

Torch-free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping


@contextlib.contextmanager
def environment(
    values: Mapping[str, str | None], env: MutableMapping[str, str] | None = None
) -> Iterator[None]:
    """Within: each of ``values`` set in ``env`` (``os.environ`` by default), a ``None``
    one unset; after: every one of them as it was before."""
    env = os.environ if env is None else env
    saved = {name: env.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = str(value)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
