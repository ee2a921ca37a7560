"""Model transforms (adapters such as LoRA) as plugins and the kernel see them.

A transform is enabled by listing its name in ``model.transforms``; its options live in
``model.transform_options.<name>``. The kernel applies every listed transform, in list
order, right after the model is built (:func:`forge_core.components.model`), which is the
one place training, ``eval``, ``sample`` and ``export-hf`` build a model through. A
transform finds what to change by the ROLES the model declares in its parallel contract
(``ParallelContract.roles``: ``"attention.q" -> "attention.wq"``), never by module names.

The model remembers what was applied to it (:func:`applied_transforms`), so code that
holds only the model (or a pipeline stage cut from it) can switch the transforms off
(:func:`transforms_disabled`: a reference model for preference training is the base
with the adapters off), see the base model as it was built (:func:`transforms_detached`,
for the model's own ``init_weights``) or fold them in (:func:`merge_transforms`, for
export). Torch-free: modules appear as ``Any``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

#: The attribute of the model's root module that records the applied transforms.
TRANSFORMS_ATTR = "forge_transforms"

#: The roles of the built-in vocabulary: a model declares the ones it has, in its
#: contract (``ParallelContract.roles``) and its facts (``ModelFacts.roles``), and may
#: declare others. Each names a linear projection inside every block.
ROLES: tuple[str, ...] = (
    "attention.q",
    "attention.k",
    "attention.v",
    "attention.o",
    "mlp.gate",
    "mlp.up",
    "mlp.down",
)


@attrs.frozen
class TransformContext:
    """Passed to ``transform.apply(model, ctx)``.

    - ``model_name``: ``model.name``, for messages.
    - ``blocks``: the attribute holding the model's repeated blocks (the contract's
      ``blocks``), or ``None`` for a model without a contract.
    - ``roles``: role -> module path relative to each block (the contract's ``roles``).
    - ``seed``: ``run.seed``; a transform's own parameters are initialised from it and
      their names, so every layout (and a resumed run) starts from the same values.
    - ``options``: the transform's structured options (``model.transform_options.<name>``).
    """

    model_name: str
    blocks: str | None
    roles: Mapping[str, str]
    seed: int
    options: Any


@attrs.frozen
class AppliedTransform:
    """A transform as applied to a model: its name, the implementation object and
    whether checkpoints keep only the trainable parameters
    (:attr:`~forge_core.api.TransformSpec.saves_trainable_only`)."""

    name: str
    impl: Any
    saves_trainable_only: bool = False


def _root(module: Any) -> Any:
    """``module`` without the wrappers that hold it (DDP's ``module``, compile's
    ``_orig_mod``)."""
    while not hasattr(module, TRANSFORMS_ATTR):
        inner = getattr(module, "_orig_mod", None)
        if inner is None:
            inner = getattr(module, "module", None)
        if inner is None or inner is module:
            return module
        module = inner
    return module


def applied_transforms(module: Any) -> tuple[AppliedTransform, ...]:
    """The transforms applied to ``module`` (a model, a pipeline stage cut from it, or a
    wrapper around either), in the order they were applied; ``()`` for none."""
    return tuple(getattr(_root(module), TRANSFORMS_ATTR, ()))


def _entered(module: Any, method: str, reverse: bool = False) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    root = _root(module)
    transforms = applied_transforms(root)
    for transform in reversed(transforms) if reverse else transforms:
        stack.enter_context(getattr(transform.impl, method)(root))
    return stack


@contextlib.contextmanager
def transforms_disabled(module: Any) -> Iterator[None]:
    """Inside, ``module`` computes as the model before any transform (adapters off);
    parameters, gradients and state are untouched. Call it on each part a process holds
    (``ParallelModel.parts``), or on the model."""
    with _entered(module, "disabled"):
        yield


@contextlib.contextmanager
def transforms_detached(module: Any) -> Iterator[None]:
    """Inside, ``module``'s parameters and submodules are exactly the model's own, as
    its factory built them (the transforms' own taken out): how the kernel calls the
    model's ``init_weights``."""
    with _entered(module, "detached", reverse=True):
        yield


def initialize_transforms(module: Any) -> None:
    """Fill every transform's own parameters of ``module`` (as this process holds them)."""
    root = _root(module)
    for transform in applied_transforms(root):
        transform.impl.initialize(root)


def merge_transforms(module: Any) -> None:
    """Fold every transform into ``module``'s own weights and take the transforms' own
    parameters out, last applied first: afterwards ``module`` has exactly the base
    model's parameters and computes what the transformed model did (for export)."""
    root = _root(module)
    for transform in reversed(applied_transforms(root)):
        transform.impl.merge(root)
    if hasattr(root, TRANSFORMS_ATTR):
        setattr(root, TRANSFORMS_ATTR, ())


def saves_trainable_only(module: Any) -> bool:
    """Whether ``module``'s checkpoints keep only its trainable parameters."""
    return any(t.saves_trainable_only for t in applied_transforms(module))
