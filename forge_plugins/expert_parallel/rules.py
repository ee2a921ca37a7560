"""Rules of expert parallelism (``parallel.ep``), judged before any process starts from
the model's declared facts (``ModelFacts.experts``: routed experts per MoE layer, 0 for a
dense model). The degrees against the world size are the kernel's rule, over the
declared dimension like every other."""

from __future__ import annotations

from typing import Any

from forge_core.api import DEGREES, Rule

EP_NEEDS_EXPERTS = "ep.model-has-experts"
EP_EXPERTS_DIVISIBLE = "ep.experts-divisible"


def _ep(ctx: Any) -> int:
    return ctx.degrees.get("ep", 1) if ctx.is_active("ep") else 1


def _experts(ctx: Any) -> int:
    return 0 if ctx.facts is None else getattr(ctx.facts, "experts", 0)


def check_needs_experts(ctx: Any) -> str | None:
    ep = _ep(ctx)
    if ep < 2 or _experts(ctx) > 0:
        return None
    model = ctx.specs["model"].name
    if ctx.facts is None:
        return (
            f"parallel.ep = {ep}, but model {model!r} declares no facts (ModelSpec.facts), so whether "
            "it has routed experts cannot be known before launch"
        )
    return (
        f"parallel.ep = {ep}, but model {model!r} has no routed experts under its options "
        "(ModelFacts.experts = 0): expert parallelism splits the experts of mixture-of-experts layers"
    )


def check_experts_divisible(ctx: Any) -> str | None:
    ep, experts = _ep(ctx), _experts(ctx)
    if ep < 2 or experts == 0 or experts % ep == 0:
        return None
    return (
        f"model {ctx.specs['model'].name!r} has {experts} routed experts per MoE layer, not divisible "
        f"by parallel.ep = {ep}: every ep rank holds the same number of whole experts"
    )


def rules() -> list[Rule]:
    return [
        Rule(
            id=EP_NEEDS_EXPERTS,
            severity="error",
            paths=("model.name", DEGREES),
            summary="Expert parallelism needs a model with routed experts (ModelFacts.experts).",
            check=check_needs_experts,
            fix="Configure mixture-of-experts layers (model.options.moe for llama), or set parallel.ep: 1.",
        ),
        Rule(
            id=EP_EXPERTS_DIVISIBLE,
            severity="error",
            paths=("model.name", DEGREES),
            summary="Expert parallelism gives every ep rank the same number of whole experts.",
            check=check_experts_divisible,
            fix="Choose parallel.ep dividing the number of routed experts, or change the number of experts.",
        ),
    ]
