"""What lifecycle hooks are told about the run they observe."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class RunContext:
    """The run as lifecycle hooks see it.

    ``config`` is the resolved :class:`forge_core.config.schema.ForgeConfig`;
    ``out_dir`` the run directory; ``start_step`` the number of optimizer steps already
    taken (above 0 after a resume); ``total_steps`` is ``config.train.steps``.
    """

    config: Any
    out_dir: str
    start_step: int
    total_steps: int
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def should_log(self, step: int) -> bool:
        """Whether loggers report ``step``: every ``logging.every`` steps, and the last."""
        return step % max(1, self.config.logging.every) == 0 or step == self.total_steps
