"""Apply the plan's model transforms (``model.transforms``) to a freshly built model.

Called by :func:`forge_core.components.model` only, so every command that builds a model
applies them the same way. Each transform, constructed from its spec by the builder, is
applied in list order with the roles the model declares in its parallel contract; the
model records what was applied
(:data:`forge_core.api.transforms.TRANSFORMS_ATTR`), which is how the kernel later
initialises, detaches, disables or merges them without being told again. A model on the
meta device gets its transforms' parameters filled when it is materialised
(:func:`forge_core.distributed.parallelize.materialize`); any other model, here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forge_core.api import ForgeError, Plan, contract_of
from forge_core.api.transforms import (
    TRANSFORMS_ATTR,
    AppliedTransform,
    TransformContext,
    initialize_transforms,
)
from forge_core.components.blame import describe, original_error
from forge_core.errors import TRACEBACK_ENV, ComponentError

if TYPE_CHECKING:
    from forge_core.registry import Registries


def apply_transforms(plan: Plan, registries: Registries, model: Any, impls: list[Any]) -> Any:
    """``model`` with every transform of ``plan.transforms`` applied in place; ``impls``:
    each one's constructed implementation, in the same order."""
    if not plan.transforms:
        return model
    from forge_core.distributed.parallelize import is_meta

    contract = contract_of(model)
    applied: list[AppliedTransform] = []
    for chosen, impl in zip(plan.transforms, impls, strict=True):
        ctx = TransformContext(
            model_name=plan.config.model.name,
            blocks=None if contract is None else contract.blocks,
            roles=dict(contract.roles) if contract is not None else {},
            seed=plan.config.run.seed,
            options=chosen.options,
        )
        try:
            impl.apply(model, ctx)
        except ForgeError:
            raise
        except Exception as exc:
            raise ComponentError(
                f"applying {describe(registries, 'transform', chosen.name)} to model "
                f"{plan.config.model.name!r} failed: {original_error(exc)} ({TRACEBACK_ENV}=1 shows "
                "where it was raised)."
            ) from exc
        applied.append(AppliedTransform(chosen.name, impl, chosen.spec.saves_trainable_only))
    setattr(model, TRANSFORMS_ATTR, tuple(applied))
    if not is_meta(model):
        initialize_transforms(model)
    return model
