"""Registers the built-in optimizers, learning-rate schedules and their rule."""

from forge_core.api import OptimizerSpec, ScheduleSpec, hookimpl
from forge_plugins.optim import options as O


@hookimpl
def forge_optimizers():
    return [
        OptimizerSpec(
            name="adamw",
            summary="AdamW, fused on CUDA and foreach elsewhere",
            impl="forge_plugins.optim.optimizers:build_adamw",
            options=O.AdamWOptions,
        ),
        OptimizerSpec(
            name="sgd",
            summary="SGD with momentum",
            impl="forge_plugins.optim.optimizers:build_sgd",
            options=O.SGDOptions,
        ),
        OptimizerSpec(
            name="muon",
            summary="Muon on the 2-D weights inside the model's blocks, AdamW on the rest",
            impl="forge_plugins.optim.muon:build_muon",
            options=O.MuonOptions,
        ),
    ]


@hookimpl
def forge_schedules():
    s = "forge_plugins.optim.schedules:"
    return [
        ScheduleSpec(
            name="cosine",
            summary="Linear warmup, then cosine decay to min_lr_ratio",
            impl=s + "cosine",
            options=O.DecayOptions,
        ),
        ScheduleSpec(
            name="linear",
            summary="Linear warmup, then linear decay to min_lr_ratio",
            impl=s + "linear",
            options=O.DecayOptions,
        ),
        ScheduleSpec(
            name="constant",
            summary="Linear warmup, then constant",
            impl=s + "constant",
            options=O.ConstantOptions,
        ),
        ScheduleSpec(
            name="wsd",
            summary="Warmup-stable-decay: constant, then a short final decay",
            impl=s + "warmup_stable_decay",
            options=O.WSDOptions,
        ),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.optim.rules import rules

    return rules()
