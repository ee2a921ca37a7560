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

    ``view`` is the read-only window a lifecycle plugin has onto the running trainer
    (``None`` where nothing is running): the current ``step``, the model (``parts``,
    ``model``), its forward-only loss (``evaluate``), the ``tokenizer``, the training
    rows (``train_rows``), the held-out documents (``heldout_documents()``) and an
    ``inference()`` context that puts the model in eval mode with gradients off and
    restores it. See :class:`forge_core.train.view.RunView` and the ``forge_eval_end``
    hook for an example. A plugin must not change what it reaches through it.
    """

    config: Any
    out_dir: str
    start_step: int
    total_steps: int
    rank: int = 0
    world_size: int = 1
    view: Any = attrs.field(default=None, eq=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def should_log(self, step: int) -> bool:
        """Whether loggers report ``step``: every ``logging.every`` steps, the last, and
        every step that evaluates (``eval.every``), so no evaluation goes unlogged."""
        if step % max(1, self.config.logging.every) == 0 or step == self.total_steps:
            return True
        return self.config.eval.due(step, self.total_steps)
