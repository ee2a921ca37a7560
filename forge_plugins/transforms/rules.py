"""Rules of the LoRA transform, judged by ``forge-run check`` before anything is built."""

from __future__ import annotations

from typing import Any

from forge_core.api.unstable import did_you_mean
from forge_plugins.transforms.options import LoraOptions

LORA_TARGETS = "lora.targets-are-roles"


def _options(ctx: Any) -> LoraOptions | None:
    if "lora" not in ctx.config.model.transforms:
        return None
    chosen = next((t for t in ctx.transforms if t.name == "lora"), None)
    return chosen.options if chosen is not None and isinstance(chosen.options, LoraOptions) else None


def check_targets(ctx: Any) -> list[str] | None:
    options = _options(ctx)
    if options is None:
        return None
    roles = sorted(ctx.facts.roles) if ctx.facts is not None else []
    if not roles:
        return [
            f"model {ctx.config.model.name!r} declares no roles (ModelFacts.roles) for LoRA to target, "
            f"so targets {options.targets} cannot be found in it"
        ]
    found = []
    for i, target in enumerate(options.targets):
        if target not in roles:
            found.append(
                f"targets[{i}] = {target!r} is not a role model {ctx.config.model.name!r} declares."
                f"{did_you_mean(target, roles)} Its roles: {', '.join(roles)}"
            )
    return found


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=LORA_TARGETS,
            severity="error",
            paths=("model.transform_options.lora.targets", "model.name"),
            summary="LoRA targets name roles the model declares, not module names",
            check=check_targets,
            fix="Name roles the model declares (the message lists them), such as attention.q or mlp.up",
        )
    ]
