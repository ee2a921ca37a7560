"""Options of the built-in objectives (no torch import: read by ``forge-run check``)."""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import above, option

#: The dpo objective's metrics, each a mean per pair: the share of pairs whose chosen
#: completion has the higher reward, the mean rewards and their mean difference (a tie,
#: a margin within rounding, is not won and has margin 0: forge_plugins.objectives.dpo).
DPO_METRICS = ("dpo/reward_accuracy", "dpo/chosen_reward", "dpo/rejected_reward", "dpo/reward_margin")


@attrs.frozen
class DpoOptions:
    beta: float = option(
        0.1,
        "How far the policy may move from the reference: the rewards are beta times the log-ratio "
        "of the policy's and the reference's sequence log-probabilities.",
        above(0),
    )
    loss: Literal["sigmoid", "ipo"] = option(
        "sigmoid",
        "'sigmoid': DPO, -log sigmoid(beta * margin). 'ipo': IPO, (margin - 1 / (2 beta))^2, the "
        "margin being (policy - reference) of the chosen minus that of the rejected completion, "
        "sequence log-probabilities summed over the completion's tokens.",
    )
    reference: Literal["model", "none"] = option(
        "model",
        "'model': a frozen reference, the model as the run starts (a copy, in eval mode, without "
        "gradients; with a model transform that can switch its adapters off, the same model with "
        "them off, no copy). 'none': reference-free, the reference log-probabilities are 0.",
    )
