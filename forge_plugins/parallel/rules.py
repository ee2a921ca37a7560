"""Compatibility rules of the built-in parallelism strategies: plain check functions over
a :class:`~forge_core.api.Plan` (config and degrees only, no torch).

The world-size product, the founding rule (a strategy that does not carry per-token
metadata to every layer refuses packers that isolate documents; pipeline parallelism
carries it, so it passes) and the model's support of each strategy are the kernel's,
expressed through the capabilities these strategies declare in ``plugin.py``; the rules
here are the limits of the implementations, each measured on torch 2.13 (the pipeline's
in :mod:`forge_plugins.parallel.pipeline`). Model-shaped limits read the model's declared facts
(``plan.facts``: layers, heads, kv heads, tied embeddings, from ``ModelSpec.facts``),
whatever its options call them.
"""

from __future__ import annotations

from typing import Any

from forge_core.api import DEGREES, PIPELINE, SEQUENCE_PARALLEL, TENSOR_PARALLEL
from forge_plugins.parallel.split import (
    LOOP_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    SPLIT_BACKWARD_SCHEDULES,
    V_SCHEDULES,
    microbatches,
)

TP_HEADS = "tp.heads-divisible"
TP_SEQUENCE_PARALLEL = "tp.sequence-parallel"
TP_SEQUENCE_PARALLEL_NO_TP = "tp.sequence-parallel-without-tp"
TP_MODEL_SEQUENCE_PARALLEL = "tp.model-supports-sequence-parallel"
DDP_WITH_TP = "ddp.not-with-tp"
PP_LAYERS = "pp.layers"
PP_MICROBATCHES = "pp.microbatches"
PP_TIED = "pp.tied-embeddings"
PP_SCHEDULE = "pp.schedule-virtual-stages"
PP_SEQUENCE_PARALLEL = "pp.not-with-sequence-parallel"
PP_SPLIT_BACKWARD_COMPILE = "pp.split-backward-not-with-compile"
PP_SPLIT_BACKWARD_RESHARD = "pp.split-backward-fsdp-reshard"


def _facts(ctx: Any, needed_by: str, requires: str) -> tuple[Any, str | None]:
    """``(facts, problem)``: the model's facts, or why the rule cannot judge it. A model
    that does not support the strategy at all is the kernel rule's to report."""
    if ctx.facts is not None:
        return ctx.facts, None
    model = ctx.specs["model"]
    if requires not in model.supports:
        return None, None
    return None, (
        f"model {model.name!r} declares no facts (ModelSpec.facts), so {needed_by} cannot be "
        "checked before launch; its authors should declare them"
    )


def _rows_per_pipeline_step(ctx: Any) -> int | None:
    """Rows one data-parallel rank feeds the pipeline per accumulation step, or None when
    the batch rule (or an unresolved dp_shard) already says the split is impossible."""
    train = ctx.config.train
    dp = ctx.data_parallel_size
    if dp < 1 or train.grad_accum < 1 or train.batch_size % (dp * train.grad_accum):
        return None
    return train.batch_size // (dp * train.grad_accum)


def check_tp_heads(ctx: Any) -> list[str]:
    tp = ctx.degrees["tp"]
    if tp <= 1:
        return []
    facts, problem = _facts(ctx, f"whether its attention heads divide by parallel.tp = {tp}", TENSOR_PARALLEL)
    if facts is None:
        return [problem] if problem else []
    model = ctx.specs["model"].name
    return [
        f"model {model!r} has {value} {what}, not divisible by parallel.tp = {tp}: tensor "
        "parallelism gives every rank whole attention heads (q/k/v are split by columns)"
        for what, value in (("query heads", facts.heads), ("key/value heads", facts.kv_heads))
        if value % tp
    ]


def _sequence_parallel(ctx: Any) -> bool:
    return ctx.options_of("tp").sequence_parallel


def check_sequence_parallel_without_tp(ctx: Any) -> str | None:
    if _sequence_parallel(ctx) and ctx.degrees["tp"] <= 1:
        return "parallel.options.tp.sequence_parallel is on but parallel.tp = 1: it has no effect"
    return None


def check_sequence_parallel_divisible(ctx: Any) -> str | None:
    tp = ctx.degrees["tp"]
    seq_len = ctx.config.data.seq_len
    if _sequence_parallel(ctx) and tp > 1 and seq_len % tp:
        return (
            f"data.seq_len = {seq_len} is not divisible by parallel.tp = {tp}: sequence "
            "parallelism gives every tensor-parallel rank an equal slice of each row"
        )
    return None


def check_model_sequence_parallel(ctx: Any) -> str | None:
    """The model's plan exists with sequence parallelism (declared on its spec). A model
    that does not support tensor parallelism at all is the kernel rule's to report."""
    model = ctx.specs["model"]
    if (
        not _sequence_parallel(ctx)
        or ctx.degrees["tp"] <= 1
        or TENSOR_PARALLEL not in model.supports
        or SEQUENCE_PARALLEL in model.supports
    ):
        return None
    return (
        f"parallel.options.tp.sequence_parallel is on, but model {model.name!r} does not declare "
        f"{SEQUENCE_PARALLEL} (its spec supports: {', '.join(sorted(model.supports))}): its "
        "tensor-parallel plan shards the layers but not the sequence between them"
    )


def check_ddp_with_tp(ctx: Any) -> str | None:
    d = ctx.degrees
    if ctx.is_active("ddp") and d["tp"] > 1:
        return (
            f"parallel.dp_replicate = {d['dp_replicate']} with dp_shard = 1 selects ddp, and "
            f"parallel.tp = {d['tp']}: DistributedDataParallel does not reduce tensor-parallel "
            "(DTensor) parameters correctly"
        )
    return None


def check_pp_layers(ctx: Any) -> str | None:
    pp = ctx.degrees["pp"]
    virtual = ctx.options_of("pp").virtual_stages
    if pp <= 1:
        return None
    stages = pp * virtual
    facts, problem = _facts(ctx, f"whether its layers fill {stages} pipeline stages", PIPELINE)
    if facts is None:
        return problem
    if facts.blocks < stages:
        return (
            f"model {ctx.specs['model'].name!r} has {facts.blocks} layers, fewer than the "
            f"{stages} pipeline stages (parallel.pp = {pp} x parallel.options.pp.virtual_stages = "
            f"{virtual}): every stage needs at least one layer"
        )
    return None


def check_pp_microbatches(ctx: Any) -> list[str]:
    options = ctx.options_of("pp")
    pp = ctx.degrees["pp"]
    if pp <= 1:
        return []
    count = microbatches(options, pp)
    problems = []
    rows = _rows_per_pipeline_step(ctx)
    if rows is not None and rows % count:
        dp = ctx.data_parallel_size
        problems.append(
            f"each pipeline step gets train.batch_size / (data-parallel {dp} x train.grad_accum "
            f"{ctx.config.train.grad_accum}) = {rows} rows, which do not split into "
            f"{count} equal microbatches"
        )
    if options.schedule == "1f1b" and count < pp:
        problems.append(
            f"the 1f1b schedule needs at least one microbatch per stage: {count} microbatches for {pp} stages"
        )
    if options.schedule in ("interleaved_1f1b", "interleaved_zero_bubble"):
        rounds = max(1, count // pp)
        if count % rounds:
            problems.append(
                f"{options.schedule} runs microbatches in rounds of parallel.pp = {pp}: {count} "
                f"microbatches do not split into {rounds} equal rounds (a multiple of {pp} works)"
            )
    if options.schedule == "dualpipev" and count < 2 * pp:
        problems.append(
            f"the dualpipev schedule needs at least one microbatch per stage: {count} microbatches "
            f"for its {2 * pp} stages (two per rank)"
        )
    return problems


def check_pp_tied_embeddings(ctx: Any) -> str | None:
    pp = ctx.degrees["pp"]
    if pp > 1 and ctx.facts is not None and ctx.facts.tied_embeddings:
        return (
            f"model {ctx.specs['model'].name!r} ties its input and output embeddings, with "
            f"parallel.pp = {pp}: the token embedding lives on the first stage and the output "
            "head on the last, so one "
            "shared matrix would have to live on two processes and its gradients would never "
            "be summed"
        )
    return None


def check_pp_schedule(ctx: Any) -> str | None:
    """Stages per rank each schedule runs: torch's single-stage schedules take one, its
    V schedules exactly two (anything else fails in torch's schedule builder), and the
    multi-stage loop schedules are offered with two or more (with one they are 1f1b or
    gpipe under another name)."""
    options = ctx.options_of("pp")
    virtual, schedule = options.virtual_stages, options.schedule
    if ctx.degrees["pp"] <= 1:
        return None
    prefix = (
        f"parallel.options.pp.schedule = {schedule!r} with parallel.options.pp.virtual_stages = {virtual}"
    )
    if schedule in SINGLE_STAGE_SCHEDULES and virtual != 1:
        return f"{prefix}: {schedule} runs one stage per rank (virtual_stages: 1)"
    if schedule in LOOP_SCHEDULES and virtual < 2:
        return (
            f"{prefix}: {schedule} alternates between several stages held by each rank "
            "(virtual_stages: 2 or more); with one stage per rank use 1f1b or gpipe"
        )
    if schedule in V_SCHEDULES and virtual != 2:
        return (
            f"{prefix}: {schedule} places exactly two stages on every rank, in a V (rank r holds "
            "stages r and 2*pp-1-r; virtual_stages: 2)"
        )
    return None


def _split_backward(ctx: Any) -> str | None:
    options = ctx.options_of("pp")
    if ctx.degrees["pp"] > 1 and options.schedule in SPLIT_BACKWARD_SCHEDULES:
        return options.schedule
    return None


def check_pp_split_backward_compile(ctx: Any) -> str | None:
    """Measured with torch 2.13 on CPU (2 processes, the tiny llama of the distributed
    tests on packed rows, sdpa): blocks compiled in place under ``zbv_zero_bubble`` fail
    in the first split backward with "This backward function was compiled with non-empty
    donated buffers which requires create_graph=False and retain_graph=False" (the input
    pass keeps the graph for the weight pass); with donated buffers switched off
    (``torch._functorch.config.donated_buffer = False``) they run, but the gradient norm
    differs from one process by 3.9e-4 relative under ``zbv_zero_bubble`` and
    ``interleaved_zero_bubble`` (compiled ``1f1b``: 0; float32 rounding: ~1e-7)."""
    schedule = _split_backward(ctx)
    if schedule is None or not ctx.is_active("compile"):
        return None
    return (
        f"parallel.options.pp.schedule = {schedule!r} splits each backward into an input pass and "
        "a later weight pass, which compiled blocks (the compile wrapper) do not support in torch "
        "2.13: the backward fails on donated buffers, and with buffer donation switched off the "
        "gradients come out wrong (gradient norm 3.9e-4 relative off one process's, measured)"
    )


def check_pp_split_backward_reshard(ctx: Any) -> str | None:
    """Measured with torch 2.13 on CPU (4 processes, pp = 2 x dp_shard = 2, the tiny llama
    of the distributed tests on packed rows): under a split-backward schedule with FSDP
    resharding after forward, the gradient norm is off one process's by 6.3% (dualpipev),
    31% (interleaved_zero_bubble) and 32% (zbv_zero_bubble); with
    ``reshard_after_forward: false`` it matches to 6e-8 (the distributed test
    ``pp_fsdp_zbv``)."""
    schedule = _split_backward(ctx)
    if schedule is None or not ctx.is_active("fsdp") or not ctx.options_of("fsdp").reshard_after_forward:
        return None
    return (
        f"parallel.options.pp.schedule = {schedule!r} splits each backward into an input pass and "
        f"a later weight pass; with fsdp sharding over parallel.dp_shard = {ctx.degrees['dp_shard']} "
        f"(times the dimensions that shard with it, such as parallel.cp) and "
        "parallel.options.fsdp.reshard_after_forward: true the weights are resharded between the "
        "two and the gradients come out wrong in torch 2.13 (gradient norm 6-32% off one "
        "process's, measured)"
    )


def check_pp_sequence_parallel(ctx: Any) -> str | None:
    if ctx.degrees["pp"] > 1 and ctx.degrees["tp"] > 1 and _sequence_parallel(ctx):
        return (
            "parallel.options.tp.sequence_parallel with parallel.pp above 1: a later pipeline stage "
            "receives its tensor-parallel rank's slice of the sequence and would take that "
            "slice's length for the whole row's (rotary positions, causal mask)"
        )
    return None


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=TP_HEADS,
            severity="error",
            paths=("parallel.tp", "model.name"),
            summary="Under tensor parallelism the model's query and key/value heads are divisible by tp.",
            check=check_tp_heads,
            fix="Choose parallel.tp among the common divisors of the model's query and key/value head "
            "counts, or change those counts in model.options.",
        ),
        Rule(
            id=TP_SEQUENCE_PARALLEL,
            severity="error",
            paths=("parallel.options.tp.sequence_parallel", "parallel.tp", "data.seq_len"),
            summary="Sequence parallelism splits every row into tp equal slices.",
            check=check_sequence_parallel_divisible,
            fix=(
                "Make data.seq_len a multiple of parallel.tp, or set "
                "parallel.options.tp.sequence_parallel: false."
            ),
        ),
        Rule(
            id=TP_MODEL_SEQUENCE_PARALLEL,
            severity="error",
            paths=("parallel.options.tp.sequence_parallel", "parallel.tp", "model.name"),
            summary="Sequence parallelism needs a model whose spec declares SEQUENCE_PARALLEL.",
            check=check_model_sequence_parallel,
            fix="Set parallel.options.tp.sequence_parallel: false (tensor parallelism alone works), or "
            "choose a model that supports it. Model authors: supply a plan for sequence_parallel=True "
            "and declare SEQUENCE_PARALLEL in ModelSpec.supports.",
        ),
        Rule(
            id=TP_SEQUENCE_PARALLEL_NO_TP,
            severity="warning",
            paths=("parallel.options.tp.sequence_parallel", "parallel.tp"),
            summary="Sequence parallelism does nothing without tensor parallelism.",
            check=check_sequence_parallel_without_tp,
            fix="Set parallel.tp above 1, or parallel.options.tp.sequence_parallel: false.",
        ),
        Rule(
            id=DDP_WITH_TP,
            severity="error",
            paths=("parallel.dp_replicate", "parallel.dp_shard", "parallel.tp"),
            summary="Replicated data parallelism (ddp) is not combined with tensor parallelism.",
            check=check_ddp_with_tp,
            fix="Shard instead: move the replicas to parallel.dp_shard (fsdp handles DTensor "
            "parameters), keeping parallel.dp_replicate: 1.",
        ),
        Rule(
            id=PP_LAYERS,
            severity="error",
            paths=("parallel.pp", "parallel.options.pp.virtual_stages", "model.name"),
            summary="pp x virtual_stages is not above the model's number of layers.",
            check=check_pp_layers,
            fix="Lower parallel.pp or parallel.options.pp.virtual_stages, or give the model more layers.",
        ),
        Rule(
            id=PP_MICROBATCHES,
            severity="error",
            paths=(
                "parallel.pp",
                "parallel.options.pp.microbatches",
                "parallel.options.pp.schedule",
                "train.batch_size",
                "train.grad_accum",
            ),
            summary="Each pipeline step's rows split evenly into microbatches the schedule accepts.",
            check=check_pp_microbatches,
            fix="Make train.batch_size / (data-parallel ranks * grad_accum) a multiple of "
            "parallel.options.pp.microbatches (0 means pp x virtual_stages), with at least pp "
            "microbatches for 1f1b, 2 x pp for dualpipev, and a multiple of pp for interleaved_1f1b "
            "and interleaved_zero_bubble.",
        ),
        Rule(
            id=PP_TIED,
            severity="error",
            paths=("parallel.pp", "model.name"),
            summary="Tied input/output embeddings cannot be split across pipeline stages.",
            check=check_pp_tied_embeddings,
            fix=(
                "Untie the model's input and output embeddings (an option of the model), "
                "or set parallel.pp: 1."
            ),
        ),
        Rule(
            id=PP_SCHEDULE,
            severity="error",
            paths=("parallel.pp", "parallel.options.pp.schedule", "parallel.options.pp.virtual_stages"),
            summary="Each schedule runs the stages per rank it is built for: gpipe and 1f1b one, "
            "interleaved_1f1b, looped_bfs and interleaved_zero_bubble two or more, zbv_zero_bubble "
            "and dualpipev exactly two.",
            check=check_pp_schedule,
            fix="Set parallel.options.pp.virtual_stages to what the schedule runs (1 for gpipe and "
            "1f1b, 2 or more for interleaved_1f1b, looped_bfs and interleaved_zero_bubble, 2 for "
            "zbv_zero_bubble and dualpipev), or choose another schedule.",
        ),
        Rule(
            id=PP_SPLIT_BACKWARD_COMPILE,
            severity="error",
            paths=("parallel.options.pp.schedule", "train.compile", "parallel.wrappers"),
            summary="Split-backward (zero-bubble) schedules are not combined with compiled blocks.",
            check=check_pp_split_backward_compile,
            fix="Switch compile off (train.compile: false, and compile not in parallel.wrappers), or use a "
            "schedule without split backward (1f1b, gpipe, "
            "interleaved_1f1b, looped_bfs).",
        ),
        Rule(
            id=PP_SPLIT_BACKWARD_RESHARD,
            severity="error",
            paths=(
                "parallel.options.pp.schedule",
                DEGREES,
                "parallel.options.fsdp.reshard_after_forward",
            ),
            summary=(
                "Split-backward (zero-bubble) schedules with FSDP keep the gathered weights until backward."
            ),
            check=check_pp_split_backward_reshard,
            fix="Set parallel.options.fsdp.reshard_after_forward: false (exact, and fewer all-gathers "
            "under pp), or use a schedule without split backward.",
        ),
        Rule(
            id=PP_SEQUENCE_PARALLEL,
            severity="error",
            paths=("parallel.pp", "parallel.tp", "parallel.options.tp.sequence_parallel"),
            summary="Sequence parallelism is not combined with pipeline parallelism.",
            check=check_pp_sequence_parallel,
            fix="Set parallel.options.tp.sequence_parallel: false (tensor parallelism alone works with pp).",
        ),
    ]
