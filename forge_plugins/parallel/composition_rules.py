"""Rules on how the built-in strategies compose with activation checkpointing and
``train.compile``: what was measured not to work (or to do nothing) is said before launch.

Measured under ``torchrun`` (gloo, CPU, torch 2.13; tests/distributed/scenarios.py: a
tiny llama, three SGD steps against one process): activation checkpointing (every block,
and every second one) trains like one process under ddp, fsdp, hsdp, tp, tp with
sequence parallelism, fsdp x tp, each pipeline schedule (gpipe, 1f1b, interleaved 1f1b)
and pp with tp, fsdp and ddp, and with ``train.compile`` under ddp, fsdp and 1f1b, within
fp32 rounding (at most 1.6e-7 relative on losses and norms); so do context parallelism
with ``train.compile`` in both attention modes and with checkpointing (``cp2_compile``,
``cp2_ulysses_compile``, ``cp2_ac_compile``: 1.1e-7). The one failure is tensor
parallelism with compiled blocks, with or without checkpointing: the first backward stops
in DTensor's redistribute (``'Tensor' object has no attribute '_local_tensor'``).
"""

from __future__ import annotations

from typing import Any

from forge_plugins.parallel.split import stage_layer_ranges

TP_COMPILE = "tp.not-with-compile"
ACT_CKPT_EVERY = "act_ckpt.every-within-blocks"


def check_tp_compile(ctx: Any) -> str | None:
    tp = ctx.degrees["tp"]
    if tp > 1 and ctx.is_active("compile"):
        return (
            f"compiled blocks (the compile wrapper) with parallel.tp = {tp}: in torch 2.13 the first "
            "backward through blocks compiled over tensor-parallel (DTensor) layers fails in DTensor's "
            "redistribute ('Tensor' object has no attribute '_local_tensor'), with or without activation "
            "checkpointing (measured under torchrun on CPU)"
        )
    return None


def _largest_part(ctx: Any, blocks: int) -> int:
    """The most blocks one model part holds: the whole model, or the largest pipeline stage."""
    stages = ctx.degrees["pp"] * ctx.options_of("pp").virtual_stages if ctx.degrees["pp"] > 1 else 1
    if blocks < stages:
        return blocks  # the pipeline rule reports this layout
    return max(len(r) for r in stage_layer_ranges(blocks, stages))


def check_act_ckpt_every(ctx: Any) -> str | None:
    if not ctx.is_active("act_ckpt") or ctx.facts is None:
        return None
    every = ctx.options_of("act_ckpt").every
    largest = _largest_part(ctx, ctx.facts.blocks)
    if every <= largest:
        return None
    where = "the model" if largest == ctx.facts.blocks else "the largest pipeline stage"
    return (
        f"parallel.options.act_ckpt.every = {every}, but {where} holds {largest} block(s): only the "
        f"{every}-th, {2 * every}-th, ... block of each part is checkpointed, so none is and "
        "activation checkpointing saves nothing"
    )


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=TP_COMPILE,
            severity="error",
            paths=("parallel.tp", "train.compile", "parallel.wrappers"),
            summary="Tensor parallelism is not combined with compiled blocks (torch 2.13 fails in backward).",
            check=check_tp_compile,
            fix="Switch compile off (train.compile: false, and compile not in parallel.wrappers), or set "
            "parallel.tp: 1.",
        ),
        Rule(
            id=ACT_CKPT_EVERY,
            severity="warning",
            paths=(
                "parallel.options.act_ckpt.every",
                "parallel.wrappers",
                "parallel.pp",
                "parallel.options.pp.virtual_stages",
                "model.name",
            ),
            summary="Activation checkpointing every k-th block checkpoints at least one block.",
            check=check_act_ckpt_every,
            fix="Lower parallel.options.act_ckpt.every to at most the blocks of one model part "
            "(1 checkpoints every block).",
        ),
    ]
