"""A saved run's model rebuilt with a checkpoint's weights, for the commands that read one
(``eval``, ``sample``, ``export-hf``): one process, no strategy.

The model is built through :func:`forge_core.components.model`, so it has the run's
model transforms. A checkpoint that holds every weight needs no pretrained files (the
option is cleared: :func:`~forge_core.components.without_pretrained`); one that holds
only the adapters gets its base from the pretrained weights (or the seed), after the
base's identity is checked against the one the checkpoint records
(:mod:`forge_core.train.base_identity`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from forge_core import components
from forge_core.api import ForgeError, Plan
from forge_core.train import train_state
from forge_core.train.base_identity import check_base, check_settings
from forge_core.train.checkpoint import load_model, train_state_name

if TYPE_CHECKING:
    from forge_core.registry import Registries


def restored_model(plan: Plan, registries: Registries, vocab_size: int | None, checkpoint: Path) -> Any:
    """The model of ``plan`` holding the weights of ``checkpoint`` (verified), on the CPU.
    ``plan`` should come through :func:`~forge_core.components.without_pretrained`."""
    if components.saves_trainable_only(plan):
        state_file = checkpoint / train_state_name(0)
        try:
            saved = train_state.read(state_file)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ForgeError(f"cannot read {state_file}: {exc}") from None
        check_base(saved, plan, checkpoint)
        check_settings(saved, plan, checkpoint, "Leave these settings as the run has them (its config.yaml).")
    model = components.model(plan, registries, vocab_size, components.attention(plan, registries))
    load_model(checkpoint, [model], verified=True)
    return model
