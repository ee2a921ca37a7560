"""Options classes of the built-in optimizers and schedules (no torch import)."""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import above, at_least, between, option

#: A decay rate or momentum: 1 or more never forgets (and diverges).
_decay = between(0, 1, high_open=True)
_fraction = between(0, 1)


@attrs.frozen
class AdamWOptions:
    beta1: float = option(0.9, "First-moment decay.", _decay)
    beta2: float = option(0.95, "Second-moment decay.", _decay)
    eps: float = option(1e-8, "Denominator epsilon.", above(0))
    weight_decay: float = option(
        0.1,
        "Decoupled weight decay, on matrices only: never on biases, norms or other 1-D parameters.",
        at_least(0),
    )
    decay_embeddings: bool = option(True, "Apply weight_decay to embedding weights (nn.Embedding) too.")
    implementation: Literal["auto", "fused", "foreach", "loop"] = option(
        "auto", "'auto': fused on CUDA, foreach elsewhere."
    )


@attrs.frozen
class SGDOptions:
    momentum: float = option(0.9, "Momentum factor.", _decay)
    nesterov: bool = option(False, "Nesterov momentum (needs a momentum above 0).")
    weight_decay: float = option(
        0.0, "L2 penalty, on matrices only: never on biases, norms or other 1-D parameters.", at_least(0)
    )
    decay_embeddings: bool = option(True, "Apply weight_decay to embedding weights (nn.Embedding) too.")


@attrs.frozen
class DecayOptions:
    min_lr_ratio: float = option(0.1, "Final learning rate as a fraction of train.lr.", _fraction)


@attrs.frozen
class WSDOptions:
    decay_fraction: float = option(0.2, "Share of the steps spent in the final decay.", _fraction)
    min_lr_ratio: float = option(0.0, "Final learning rate as a fraction of train.lr.", _fraction)
    decay_shape: Literal["linear", "cosine", "sqrt"] = option("sqrt", "Shape of the final decay.")


@attrs.frozen
class ConstantOptions:
    pass


@attrs.frozen
class MuonOptions:
    """Muon (``torch.optim.Muon``) on the 2-D weights inside the model's blocks, AdamW on
    every other parameter; both step at ``train.lr`` and its schedule."""

    momentum: float = option(0.95, "Muon's momentum factor.", _decay)
    nesterov: bool = option(True, "Muon's Nesterov momentum.")
    ns_steps: int = option(
        5, "Newton-Schulz iterations that orthogonalise each update (below 100).", between(1, 99)
    )
    ns_coefficients: tuple[float, float, float] = option(
        (3.4445, -4.775, 2.0315), "Coefficients (a, b, c) of the Newton-Schulz quintic polynomial."
    )
    eps: float = option(1e-7, "Muon's stabiliser of the Newton-Schulz normalisation.", above(0))
    adjust_lr: Literal["match_rms_adamw", "original"] = option(
        "match_rms_adamw",
        "Muon's learning-rate scaling per matrix shape (torch's adjust_lr_fn): 'match_rms_adamw' "
        "(0.2 * sqrt(max(A, B)), so that the AdamW learning rate and weight decay carry over) or "
        "'original' (sqrt(max(1, A/B)), which expects a learning rate around 0.02: then AdamW gets it too).",
    )
    weight_decay: float = option(0.1, "Muon's decoupled weight decay on its matrices.", at_least(0))
    adamw_beta1: float = option(0.9, "AdamW's first-moment decay (the other parameters).", _decay)
    adamw_beta2: float = option(0.95, "AdamW's second-moment decay.", _decay)
    adamw_eps: float = option(1e-8, "AdamW's denominator epsilon.", above(0))
    adamw_weight_decay: float = option(
        0.1,
        "AdamW's decoupled weight decay, on matrices only (the output head; embeddings with "
        "decay_embeddings): never on biases, norms or other 1-D parameters.",
        at_least(0),
    )
    decay_embeddings: bool = option(True, "Apply adamw_weight_decay to embedding weights (nn.Embedding) too.")
