"""Registers the built-in model transforms and their rules."""

from forge_core.api import TransformSpec, hookimpl
from forge_plugins.transforms import options as O
from forge_plugins.transforms import rules as R


@hookimpl
def forge_transforms():
    return [
        TransformSpec(
            name="lora",
            summary="Low-rank adapters on the projections the model declares by role; base frozen",
            impl="forge_plugins.transforms.lora:Lora",
            options=O.LoraOptions,
            saves_trainable_only=True,
            # dropout changes how the adapters train, not what their weights mean.
            weight_options=("targets", "rank", "alpha"),
        )
    ]


@hookimpl
def forge_rules():
    return R.rules()
