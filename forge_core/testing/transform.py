"""The transform check of the conformance kit: :func:`check_transform` proves, in one
process and in float64, what a model transform (``model.transforms``) must keep.

The transform is applied by the kernel's own path (:func:`forge_core.components.model`,
as every command applies it) to a small registered model, and checked, each failure an
``AssertionError`` naming the transform and what to fix:

- **names**: every parameter of the model keeps its name (checkpoints, Hugging Face
  imports and tensor-parallel plans are keyed by them); the transform's own parameters
  are new names, and they are the only ones still requiring a gradient when it says it
  freezes the base (``saves_trainable_only``);
- **initialize**: two builds from the same seed hold the same values of the transform's
  parameters (every layout and a resumed run start from the same ones);
- **detached**: inside ``detached(model)`` the parameters are exactly the model's own;
- **disabled**: inside ``disabled(model)`` the model computes what it computes without
  the transform, after the transform's parameters are moved off their initial values
  (the reference model of preference training);
- **merge**: after ``merge(model)`` the model has exactly its own parameters again and
  computes what the transformed model computed (what ``export-hf`` writes).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from forge_core.api import ChosenTransform, ForgeError, TransformSpec, hookimpl
from forge_core.api.transforms import merge_transforms, transforms_detached, transforms_disabled
from forge_core.testing.resolve import structure_options
from forge_core.testing.strategy import TINY_LLAMA
from forge_core.testing.tolerance import assert_within_rounding, longest_sum

CHECKS = ("names", "initialize", "detached", "disabled", "merge")
#: The plugin name under which a spec given to the check (not registered) is registered.
KIT_PLUGIN = "conformance_kit_transform"


@attrs.frozen
class TransformReport:
    """What :func:`check_transform` checked (names from :data:`CHECKS`) and the names of
    the transform's own parameters."""

    checked: tuple[str, ...]
    added: tuple[str, ...]


def _registries(transform: Any, extra_plugins: tuple) -> tuple[Any, TransformSpec, str]:
    from forge_core.registry import load_registries

    registries = load_registries(extra=extra_plugins)
    registry = registries["transform"]
    if isinstance(transform, str):
        try:
            return registries, registry.get(transform), registry.plugin_of(transform)
        except ForgeError as error:
            raise ValueError(str(error)) from None
    if not isinstance(transform, TransformSpec):
        raise ValueError(
            f"check_transform takes a registered transform's name or a TransformSpec, got {transform!r}"
        )
    plugin = types.SimpleNamespace(forge_transforms=hookimpl(lambda: [transform]))
    prefer = {"transform": {transform.name: KIT_PLUGIN}} if transform.name in registry else None
    registries = load_registries(extra=(*extra_plugins, (KIT_PLUGIN, plugin)), prefer=prefer)
    return registries, transform, KIT_PLUGIN


def check_transform(
    transform: Any,
    *,
    options: Any = None,
    model: str = "llama",
    model_options: Any = None,
    seed: int = 0,
    extra_plugins: Sequence[tuple[str, Any]] = (),
) -> TransformReport:
    """Check a model transform (module docstring); raise AssertionError naming it and
    what is wrong. ``transform`` is a registered name or a
    :class:`~forge_core.api.TransformSpec`; ``options`` a mapping (structured against its
    options class), an options instance, or ``None`` (the defaults); ``model`` the
    registered model it is applied to, with ``model_options`` (default: a tiny llama)."""
    from forge_core import components
    from forge_core.config.loader import structure_config
    from forge_core.plan import make_plan

    registries, spec, plugin = _registries(transform, tuple(extra_plugins))
    label = f"transform {spec.name!r}" + ("" if plugin == KIT_PLUGIN else f" (plugin {plugin!r})")
    structured = structure_options(spec, options)
    if model_options is None:
        model_options = TINY_LLAMA if model == "llama" else {}
    raw = {"model": {"name": model, "options": model_options}, "run": {"seed": seed}}
    try:
        config = structure_config(raw, lambda plugins: registries)
    except ForgeError as error:
        raise ValueError(
            f"check_transform: the model {model!r} with options {model_options!r}: {error}"
        ) from None
    bare_plan = make_plan(config, registries, 1)
    plan = attrs.evolve(bare_plan, transforms=(ChosenTransform(spec, structured, plugin),))
    vocab = 61

    def build(with_transform: bool) -> torch.nn.Module:
        torch.manual_seed(seed)
        chosen = plan if with_transform else bare_plan
        return components.model(chosen, registries, vocab, components.attention(chosen, registries)).double()

    base, built, again = build(False), build(True), build(True)
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))
    terms = longest_sum(base, ids.shape[1])
    checked = []

    own = dict(base.named_parameters())
    names = dict(built.named_parameters())
    lost = sorted(set(own) - set(names))
    assert not lost, f"{label}: the model's parameters {lost[:5]} lost their names under the transform"
    added = tuple(sorted(set(names) - set(own)))
    if spec.saves_trainable_only:
        trainable = sorted(n for n, p in names.items() if p.requires_grad)
        assert trainable and set(trainable) <= set(added), (
            f"{label}: saves_trainable_only, but the parameters still training are {trainable[:5]}: "
            "freeze the base (requires_grad_(False)) and keep the transform's own trainable"
        )
    checked.append("names")

    again_params = dict(again.named_parameters())
    differ = [n for n in added if not torch.equal(names[n], again_params[n])]
    assert not differ, (
        f"{label}: two builds from seed {seed} hold different {differ[:3]}: initialise from the seed"
    )
    checked.append("initialize")

    with transforms_detached(built):
        inside = sorted(n for n, _ in built.named_parameters())
    assert inside == sorted(own), f"{label}: inside detached() the parameters are not the model's own"
    checked.append("detached")

    built.eval()
    base.eval()
    with torch.no_grad():
        for n in added:  # off their initial values: adapters starting at zero would prove nothing
            names[n].add_(
                torch.randn(names[n].shape, generator=torch.Generator().manual_seed(1), dtype=names[n].dtype)
                * 0.1
            )
        transformed = built(ids)
        assert not torch.allclose(transformed, base(ids)), (
            f"{label}: with its parameters moved, the transformed model still computes the model's logits"
        )
        with transforms_disabled(built):
            assert_within_rounding(
                built(ids), base(ids), dtype=torch.float64, terms=terms, what=f"{label}: disabled()"
            )
        checked.append("disabled")
        merge_transforms(built)
        assert sorted(n for n, _ in built.named_parameters()) == sorted(own), (
            f"{label}: after merge() the model's parameters are not exactly its own"
        )
        assert_within_rounding(
            built(ids), transformed, dtype=torch.float64, terms=terms, what=f"{label}: merge()"
        )
    checked.append("merge")
    return TransformReport(tuple(checked), added)
