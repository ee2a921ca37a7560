"""Registers the built-in training objectives."""

from forge_core.api import DOC_IDS, ObjectiveSpec, hookimpl
from forge_plugins.objectives.options import DPO_METRICS, DpoOptions


@hookimpl
def forge_objectives():
    return [
        ObjectiveSpec(
            name="lm",
            summary="Next-token cross-entropy over the labelled tokens",
            impl="forge_plugins.objectives.lm:LanguageModeling",
            per_token=True,
            pipeline=True,
            hidden_states=True,
            token_split=True,
        ),
        ObjectiveSpec(
            name="dpo",
            summary="Preference pairs: DPO, IPO or reference-free, per pair",
            impl="forge_plugins.objectives.dpo:DirectPreference",
            options=DpoOptions,
            needs={DOC_IDS},
            unit="pairs",
            metrics=DPO_METRICS,
        ),
    ]
