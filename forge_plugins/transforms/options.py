"""Options of the built-in model transforms (``model.transform_options.<name>``). Light on
purpose: imported by ``forge-run check``."""

from __future__ import annotations

import attrs

from forge_core.api import above, at_least, between, option, satisfies


def _roles_given(value: list[str]) -> bool:
    return bool(value) and len(set(value)) == len(value)


@attrs.frozen
class LoraOptions:
    rank: int = option(8, "Rank r of each adapter: A is r x in_features, B is out_features x r.", at_least(1))
    alpha: float = option(
        16.0, "Scale numerator: each adapter's output is multiplied by alpha / rank.", above(0)
    )
    dropout: float = option(
        0.0,
        "Dropout on the adapter's input during training (0: none); the base path never drops.",
        between(0, 1, high_open=True),
    )
    targets: list[str] = option(
        ["attention.q", "attention.v"],
        "Roles of the projections to adapt, as the model declares them in its contract: "
        "attention.q, attention.k, attention.v, attention.o, mlp.gate, mlp.up, mlp.down for "
        "the built-in llama. Never module names.",
        satisfies("a non-empty list of roles without repeats", _roles_given),
    )
