"""A run that starts from another run's adapters (``model.init_adapters_from``): SFT with
LoRA, then DPO that keeps training the SFT adapters.

The source is a run directory (its latest complete checkpoint) or one checkpoint of it,
verified like any checkpoint read (:func:`~forge_core.train.checkpoint.resolve_checkpoint`).
Before a tensor is read, its train state must show adapters on the base this run builds
(:func:`~forge_core.train.base_identity.check_base`) made under the same settings
(:func:`~forge_core.train.base_identity.check_settings`): otherwise the run is refused,
saying what differs. Only the adapters are read (the checkpoint's optimizer state, step,
schedule and loader position are not): the run is a new one, from step 0. Once it has a
checkpoint of its own, a restart resumes from that and the source is not read again,
except for the frozen reference of an objective that needs one.

The reference of such an objective (``dpo``) is the model as the run starts, as without
this option: here that is the base with the starting adapters (the SFT policy, the
reference of the DPO paper and of TRL's recipe for a PEFT SFT model, which loads the SFT
adapter a second time as the reference). It cannot be the trained model with its
adapters switched off (that is the bare base), so it is a frozen copy of the model with
the starting adapters loaded (:func:`~forge_core.train.reference.build_reference`): one
more copy of the base weights in memory.
"""

from __future__ import annotations

from pathlib import Path

import torch

from forge_core.api import ForgeError, Plan
from forge_core.api.transforms import transforms_detached
from forge_core.train import train_state
from forge_core.train.base_identity import STATE_KEY, base_identity, check_base, check_settings
from forge_core.train.checkpoint import load_model, resolve_checkpoint, train_state_name

#: The config key, for messages.
KEY = "model.init_adapters_from"


def source_checkpoint(plan: Plan, identity: str | None = None) -> Path | None:
    """The verified checkpoint ``model.init_adapters_from`` names, once its adapters are
    shown to fit ``plan`` (same base, of identity ``identity`` when given, and same
    settings); ``None`` when it names none."""
    given = plan.config.model.init_adapters_from
    if not given:
        return None
    try:
        checkpoint, _ = resolve_checkpoint(given)
    except ForgeError as exc:
        raise ForgeError(f"{KEY} = {given!r}: {exc}") from None
    state_file = checkpoint / train_state_name(0)
    try:
        state = train_state.read(state_file)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ForgeError(f"{KEY} = {given!r}: cannot read {state_file}: {exc}") from None
    if state.get(STATE_KEY) is None:
        raise ForgeError(
            f"{KEY} = {given!r}: checkpoint {checkpoint} holds no adapters apart from its base (its run "
            "had no transform such as lora), so there are none to start from. Give a run trained with "
            "model.transforms: [lora], or start this run from that run's weights another way (export-hf, "
            "then model.options.init_from_hf)."
        )
    run = checkpoint.parent.parent
    check_base(
        state,
        plan,
        checkpoint,
        identity or base_identity(plan),
        f"To start from its adapters ({KEY}), give this run the base {run} was trained on (model.options "
        "in its config.yaml).",
    )
    check_settings(
        state,
        plan,
        checkpoint,
        f"To start from its adapters ({KEY}), set model.transform_options as {run} has them (its "
        f"config.yaml); to train adapters of another shape, leave out {KEY}.",
    )
    return checkpoint


def load_adapters(checkpoint: Path, parts: list[torch.nn.Module]) -> None:
    """Load the adapters of ``checkpoint`` (verified by :func:`source_checkpoint`) into
    ``parts``, whatever their layout (the checkpoint reader reshards)."""
    load_model(checkpoint, parts, verified=True)


def load_frozen_adapters(checkpoint: Path, copy: torch.nn.Module) -> None:
    """Load the adapters of ``checkpoint`` into ``copy``, a frozen copy of the model (the
    reference). Checkpoints of adapters are read by the parameters that train; in the
    copy none does, so the transforms' own parameters (those the model lacks with them
    detached) train for the time of the load."""
    with transforms_detached(copy):
        base = {id(p) for p in copy.parameters()}
    own = [p for p in copy.parameters() if id(p) not in base]
    for param in own:
        param.requires_grad_(True)
    try:
        load_model(checkpoint, [copy], verified=True)
    finally:
        for param in own:
            param.requires_grad_(False)
