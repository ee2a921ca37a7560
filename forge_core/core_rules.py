"""Rules about how components combine, owned by the kernel because they reason only
over declared capabilities, degrees and the run's own settings, never over a concrete
component.

Registered by the kernel itself as the plugin ``core_rules``, which no config, variable
or package can block or replace (see :data:`forge_core.plugins.KERNEL_PLUGINS`): other
components rely on these rules (a third-party backend on the doc-id rule, every
strategy on the metadata rule).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from forge_core import hardware
from forge_core.api import DEGREES, DOC_IDS, OUTPUT_HEAD, Plan, Rule, hookimpl
from forge_core.api.files import directory_problem


def _filler(ctx: Plan) -> Any:
    """The dimension whose degree may be -1 (``dp_shard``), or ``None``."""
    return next((d for d in ctx.dims if d.fills_world), None)


def _given(ctx: Plan) -> dict[str, int]:
    """The degrees as the config gives them (the filler's -1 unresolved)."""
    return {d.name: ctx.get(f"parallel.{d.name}") for d in ctx.dims}


def _others(ctx: Plan, filler: Any) -> tuple[int, str]:
    """The product of every degree but the filler's, and how it is written (``pp*tp``)."""
    degrees = _given(ctx)
    names = [d.name for d in ctx.dims if d is not filler]
    return math.prod(degrees[n] for n in names), "*".join(names) or "1"


def check_world_size(ctx: Plan) -> list[str]:
    # Each degree is at least 1 (the filler's may be -1): the degree check says so.
    if ctx.world_size is None:
        return []
    resolved, filler = ctx.degrees, _filler(ctx)
    if filler is not None and resolved[filler.name] == -1:
        others, names = _others(ctx, filler)
        return [
            f"{filler.name}: -1 cannot take what is left: the world size {ctx.world_size} is not "
            f"divisible by {names} = {others}"
        ]
    product = math.prod(resolved.values())
    if product != ctx.world_size:
        shown = " * ".join(f"{dim}={size}" for dim, size in resolved.items())
        return [f"{shown} = {product} processes, but the world size is {ctx.world_size}"]
    return []


def world_size_fix(ctx: Plan) -> str:
    """The remedy for this config: the filler's -1 (``dp_shard: -1``) is offered only
    where it is not set already and would resolve (the other degrees divide the world
    size)."""
    filler = _filler(ctx)
    if filler is None:
        return f"Launch {math.prod(ctx.degrees.values())} processes, or change the degrees."
    others, names = _others(ctx, filler)
    changeable = ", ".join(f"parallel.{d.name}" for d in ctx.dims if d is not filler)
    given = _given(ctx)[filler.name]
    if given == -1:
        return (
            f"Launch a multiple of {names} = {others} processes, or change {changeable} so that "
            f"their product divides {ctx.world_size}."
        )
    product = others * given
    if ctx.world_size % others == 0:
        return (
            f"Set parallel.{filler.name}: -1 to take what the other degrees leave "
            f"({ctx.world_size // others} here), or launch {product} processes."
        )
    return (
        f"Launch {product} processes, or change the degrees: {names} = {others} does not divide "
        f"the world size {ctx.world_size}, so parallel.{filler.name}: -1 would not resolve either."
    )


def check_stated_world_size(ctx: Plan) -> str | None:
    stated = ctx.config.run.world_size
    if stated is None or ctx.world_size is None or ctx.world_size == stated:
        return None
    return (
        f"run.world_size = {stated}: this config is made for {stated} processes, but the world size "
        f"is {ctx.world_size}"
    )


def stated_world_size_fix(ctx: Plan) -> str:
    stated = ctx.config.run.world_size
    return (
        f"Launch {stated} processes (`forge-run --nproc {stated} CONFIG` on one machine, `srun` with "
        f"{stated} tasks; `forge-run check CONFIG` judges at {stated}), or run it on {ctx.world_size} by "
        f"overriding run.world_size={ctx.world_size}, once the degrees, batch and memory per process "
        "suit that many."
    )


def check_seq_len(ctx: Plan) -> str | None:
    option = ctx.specs["model"].max_seq_len_option
    if option is None:
        return None
    limit = getattr(ctx.config.model.options, option, None)
    seq_len = ctx.config.data.seq_len
    if limit is not None and seq_len > limit:
        return f"data.seq_len = {seq_len} exceeds the model's maximum model.options.{option} = {limit}"
    return None


def check_metadata_forwarded(ctx: Plan) -> list[str]:
    """The founding rule, expressed through capabilities: every per-token key the packer
    emits must reach every layer under every active strategy."""
    problems = []
    packer = ctx.specs["packer"]
    for active in ctx.strategies:
        strategy = active.spec
        lost = sorted(key for key in ctx.emitted if not strategy.forwards_key(key))
        if not lost:
            continue
        why = f" {strategy.drops_metadata_because}" if strategy.drops_metadata_because else ""
        consequence = ""
        if DOC_IDS in lost:
            consequence = (
                " So attention never learns where documents end: documents attend across each"
                " other, and because the labels still carry -100 at document boundaries the"
                " loss looks correct while the model trains on the wrong attention pattern."
            )
        problems.append(
            f"packer {packer.name!r} emits {', '.join(lost)} to isolate documents, but strategy "
            f"{strategy.name!r} does not forward {'them' if len(lost) > 1 else 'it'} to every "
            f"layer.{why}{consequence}"
        )
    return problems


def metadata_fix_for(ctx: Plan) -> str:
    """The founding rule's fix, naming the strategies of this config that drop metadata."""
    dropping = sorted(
        active.spec.name
        for active in ctx.strategies
        if any(not active.spec.forwards_key(key) for key in ctx.emitted)
    )
    return (
        "Use a packer that does not isolate documents (data.packer: none, or concat with "
        f"data.packer_options.isolate: false), or switch off {', '.join(map(repr, dropping))}, which "
        "drops them."
    )


def check_model_supports_strategies(ctx: Plan) -> list[str]:
    """Every active strategy finds in the model the contract pieces it needs."""
    model = ctx.specs["model"]
    problems = []
    for active in ctx.strategies:
        strategy = active.spec
        missing = sorted(strategy.requires - model.supports)
        if not missing:
            continue
        off = (
            f"parallel.{strategy.mesh_dim}: 1"
            if strategy.mesh_dim
            else f"remove {strategy.name!r} from parallel.wrappers"
        )
        problems.append(
            f"strategy {strategy.name!r} needs the model to supply {', '.join(missing)} through its parallel "
            f"contract, but model {model.name!r} does not declare {'them' if len(missing) > 1 else 'it'} "
            f"(its spec supports: {', '.join(sorted(model.supports)) or 'nothing'}): the strategy cannot "
            f"know how to split or shard it. Switch the strategy off ({off}) or choose a model that "
            "supports it"
        )
    return problems


def check_loss_finds_head(ctx: Plan) -> str | None:
    """The chunked loss applies the model's output head itself: the model must say where
    it is."""
    model = ctx.specs["model"]
    if ctx.config.train.loss.name != "chunked" or OUTPUT_HEAD in model.supports:
        return None
    return (
        f"train.loss.name: chunked computes the output projection and the cross-entropy chunk by chunk, "
        f"so it must apply the model's output head itself, but model {model.name!r} does not declare "
        f"{OUTPUT_HEAD} (its spec supports: {', '.join(sorted(model.supports)) or 'nothing'})"
    )


def _objective(ctx: Plan) -> Any:
    return ctx.specs.get("objective")


def check_objective_under_pipeline(ctx: Plan) -> str | None:
    """The last pipeline stage calls the loss with a microbatch's output and labels only."""
    objective = _objective(ctx)
    if objective is None or objective.pipeline or ctx.degrees.get("pp", 1) <= 1:
        return None
    return (
        f"objective {objective.name!r} cannot run under pipeline parallelism (parallel.pp = "
        f"{ctx.degrees['pp']}): the last stage computes the loss of each microbatch from its output and "
        "labels alone, without the rest of the batch or a reference model it needs"
    )


def check_objective_takes_output(ctx: Plan) -> str | None:
    """The chunked loss makes the model return hidden states, not logits."""
    objective = _objective(ctx)
    if objective is None or objective.hidden_states or ctx.config.train.loss.name != "chunked":
        return None
    return (
        f"objective {objective.name!r} reads the logits, but train.loss.name: chunked makes the model "
        "return its final hidden states (the loss applies the output head chunk by chunk); the "
        "objective would be computed on the wrong tensor"
    )


def check_objective_under_token_split(ctx: Plan) -> str | None:
    """A token split leaves each process a share of every row's tokens."""
    objective = _objective(ctx)
    if objective is None or objective.token_split or ctx.token_split <= 1:
        return None
    split = ", ".join(f"parallel.{d.name} = {ctx.degrees[d.name]}" for d in ctx.dims if d.splits_tokens)
    return (
        f"objective {objective.name!r} is not a sum over tokens, but {split} splits every row's tokens "
        "over processes, each of which would compute it on its share of each sequence"
    )


def check_objective_needs(ctx: Plan) -> str | None:
    """The objective reads per-token metadata the packer must emit."""
    objective = _objective(ctx)
    missing = sorted(objective.needs - ctx.emitted) if objective is not None else []
    if not missing:
        return None
    return (
        f"objective {objective.name!r} reads {', '.join(missing)} from every batch, but packer "
        f"{ctx.config.data.packer!r} does not emit {'it' if len(missing) == 1 else 'them'} under its options "
        f"(it emits: {', '.join(sorted(ctx.emitted)) or 'nothing'})"
    )


def check_honours_doc_ids(ctx: Plan) -> str | None:
    """The packer isolates documents but the backend would let them attend across."""
    backend = ctx.specs.get("attention")
    if backend is None or DOC_IDS not in ctx.emitted or DOC_IDS in backend.honours:
        return None
    return (
        f"packer {ctx.config.data.packer!r} emits doc_ids to keep packed documents apart, "
        f"but attention backend {backend.name!r} does not honour doc_ids: every token would "
        "attend to the earlier documents of its row while the loss still looks normal"
    )


def check_pairs_isolated(ctx: Plan) -> str | None:
    """Preference pairs are two documents in one row: attention must keep them apart."""
    if ctx.config.data.chat.format != "preference" or DOC_IDS in ctx.emitted:
        return None
    return (
        f"data.chat.format is 'preference', but packer {ctx.config.data.packer!r} emits no doc_ids: the "
        "rejected completion of every pair would attend to the chosen one"
    )


def streamed_sources(ctx: Plan) -> list[str]:
    """Where the config asks for a stream: ``data.stream.enabled``, or a source whose
    spec's ``streaming_option`` is on (``data.source_options.streaming``)."""
    out = ["data.stream.enabled"] if ctx.config.data.stream.enabled else []
    for chosen in ctx.sources:
        name = getattr(chosen.spec, "streaming_option", "")
        if name and getattr(chosen.options, name, False) is True:
            block = "data.source_options" if chosen.where == "data.source" else f"{chosen.where}.options"
            out.append(f"{block}.{name}")
    return out


def check_stream_one_source(ctx: Plan) -> str | None:
    asked = streamed_sources(ctx)
    if not asked or len(ctx.sources) < 2:
        return None
    return (
        f"{', '.join(asked)} asks for a stream, but data.sources mixes {len(ctx.sources)} sources: a "
        "mixture reads every source's rows by number (its weights need each source's size), which a "
        "stream does not know before its end"
    )


def _under_stream(ctx: Plan) -> str:
    """``" under a stream (the keys that ask for it)"``, or ``""`` when nothing streams."""
    asked = streamed_sources(ctx)
    return f" under a stream ({', '.join(asked)})" if asked else ""


def check_stream_heldout(ctx: Plan) -> str | None:
    why, fraction = _under_stream(ctx), ctx.config.data.heldout.fraction
    if not why or fraction <= 0:
        return None
    return (
        f"data.heldout.fraction is {fraction}{why}: the held-out split is read from the token cache, "
        "which a stream does not fill"
    )


def check_stream_chat(ctx: Plan) -> str | None:
    why, fmt = _under_stream(ctx), ctx.config.data.chat.format
    return f"data.chat.format is {fmt!r}{why}: chat data is not streamed yet" if why and fmt else None


def check_stream_workers(ctx: Plan) -> str | None:
    why, workers = _under_stream(ctx), ctx.config.data.num_workers
    if not why or not workers:
        return None
    return (
        f"data.num_workers is {workers}{why}: a stream is tokenized and packed by its own background "
        "thread, not by loader worker processes"
    )


def check_stream_window(ctx: Plan) -> str | None:
    why, data = _under_stream(ctx), ctx.config.data
    if not why or data.stream.window_tokens >= 2 * data.seq_len:
        return None
    return (
        f"data.stream.window_tokens is {data.stream.window_tokens}{why}: less than two rows of "
        f"data.seq_len {data.seq_len}"
    )


def check_out_dir(ctx: Plan) -> str | None:
    """The run directory cannot be used (created if missing, written): the same answer
    the run gives when it takes the directory (:func:`~forge_core.api.files.directory_problem`)."""
    out_dir = ctx.config.run.out_dir
    why = directory_problem(Path(out_dir))
    return f"run.out_dir {out_dir!r} {why}" if why else None


def check_model_accepts(ctx: Plan) -> str | None:
    model = ctx.specs["model"]
    refused = sorted(ctx.emitted - model.accepts)
    if refused:
        return (
            f"packer {ctx.specs['packer'].name!r} emits {', '.join(refused)}, which model "
            f"{model.name!r} does not take (it accepts: {', '.join(sorted(model.accepts)) or 'nothing'}); "
            "the first forward pass would fail"
        )
    return None


def check_batch_divisible(ctx: Plan) -> str | None:
    train = ctx.config.train
    dp = ctx.data_parallel_size
    if dp < 1:
        return None  # dp_shard unresolved; the world-size rule reports it
    if train.batch_size % (dp * train.grad_accum):
        return (
            f"train.batch_size = {train.batch_size} rows cannot be split evenly over "
            f"{dp} data-parallel ranks x {train.grad_accum} accumulation steps"
        )
    return None


def check_eval_heldout(ctx: Plan) -> str | None:
    cfg = ctx.config
    if not cfg.eval.enabled or cfg.eval.source or cfg.data.heldout.fraction > 0:
        return None
    return (
        "evaluation reads the held-out split of the training data (eval.source: ''), but "
        "data.heldout.fraction is 0: no document is held out, so there is nothing to evaluate on"
    )


def check_eval_batch(ctx: Plan) -> str | None:
    cfg = ctx.config
    if not cfg.eval.batch_size:
        return None  # the training micro-batch: train.batch-divisible judges it
    dp = ctx.data_parallel_size
    rows = cfg.eval.batch_rows(cfg.train)
    if dp < 1 or rows % dp == 0:
        return None  # dp_shard unresolved: the world-size rule reports it
    return f"eval.batch_size = {rows} cannot be split evenly over {dp} data-parallel ranks"


def check_eval_scheduled(ctx: Plan) -> str | None:
    ev, steps = ctx.config.eval, ctx.config.train.steps
    if not ev.enabled:
        return None
    if not ev.at_end and ev.every == 0:
        return "eval.enabled is true, but eval.every is 0 and eval.at_end is false: the run never evaluates"
    if not ev.at_end and ev.every > steps:
        return (
            f"eval.every = {ev.every} exceeds train.steps = {steps} and eval.at_end is false: "
            "the run never evaluates"
        )
    return None


def check_eval_every_enabled(ctx: Plan) -> str | None:
    ev = ctx.config.eval
    if ev.enabled or ev.every == 0:
        return None
    return f"eval.every = {ev.every}, but eval.enabled is false: the run never evaluates"


def check_transforms_once(ctx: Plan) -> str | None:
    names = list(ctx.config.model.transforms)
    twice = sorted({n for n in names if names.count(n) > 1})
    if not twice:
        return None
    return (
        f"model.transforms = {names} lists {', '.join(map(repr, twice))} more than once: a transform is "
        "applied once, with its one block of options in model.transform_options"
    )


def check_transform_options_used(ctx: Plan) -> str | None:
    unused = sorted(set(ctx.config.model.transform_options) - set(ctx.config.model.transforms))
    if not unused:
        return None
    return (
        f"model.transform_options has options for {', '.join(map(repr, unused))}, which model.transforms = "
        f"{list(ctx.config.model.transforms)} does not list: they are not applied"
    )


def check_adapters_from(ctx: Plan) -> str | None:
    source = ctx.config.model.init_adapters_from
    if not source or any(t.spec.saves_trainable_only for t in ctx.transforms):
        return None
    return (
        f"model.init_adapters_from = {source!r}, but model.transforms = {list(ctx.config.model.transforms)} "
        "has no transform whose checkpoints hold adapters apart from the base (such as lora): there are "
        "no adapters to start from"
    )


def _cpu_without_bf16(ctx: Plan) -> str | None:
    """Why bf16 would run on a CPU without native bf16 here, or None: bf16 not asked for,
    or the flags unknown (not Linux), or they list it."""
    if ctx.config.train.precision != "bf16":
        return None
    flags = hardware.cpu_flags()
    if flags is None or hardware.cpu_has_native_bf16(flags):
        return None
    return (
        "this machine's CPU has no native bf16 arithmetic (/proc/cpuinfo lists none of "
        f"{', '.join(sorted(hardware.BF16_FLAGS))}): bf16 would be emulated through fp32, slower than "
        "fp32, and the run stops at start with this error"
    )


def check_bf16_on_cpu(ctx: Plan) -> str | None:
    if ctx.config.run.device != "cpu":
        return None
    why = _cpu_without_bf16(ctx)
    return f"train.precision: bf16 with run.device: cpu, but {why}" if why else None


def check_bf16_on_auto_device(ctx: Plan) -> str | None:
    # A warning, not an error: with run.device: auto the run takes a GPU where it finds
    # one, and check may be judging the config on another machine than the run's.
    if ctx.config.run.device != "auto" or hardware.cuda_gpu_visible() is not False:
        return None
    why = _cpu_without_bf16(ctx)
    return (
        f"train.precision: bf16 with run.device: auto, and no CUDA GPU is visible here, so a run on this "
        f"machine trains on the CPU; but {why}"
        if why
        else None
    )


BF16_FIX = (
    "Set train.precision: fp32, or train on a CUDA GPU with bf16 or a CPU with AVX512_BF16 or "
    "AMX (run.device: cuda, or auto where a GPU is)."
)

RULES = [
    Rule(
        id="parallel.world-size",
        severity="error",
        paths=(DEGREES,),
        summary="The product of the parallel degrees equals the world size.",
        check=check_world_size,
        fix=(
            "Change the degrees, set parallel.dp_shard: -1 to take what is left (where the other "
            "degrees divide the world size), or launch as many processes as the product."
        ),
        fix_for=world_size_fix,
    ),
    Rule(
        id="run.world-size",
        severity="error",
        paths=("run.world_size",),
        summary="A config that states the world size it is made for (run.world_size) runs at that size.",
        check=check_stated_world_size,
        fix="Launch run.world_size processes, or override run.world_size to the size you launch.",
        fix_for=stated_world_size_fix,
    ),
    Rule(
        id="model.seq-len",
        severity="error",
        paths=("data.seq_len",),
        summary="data.seq_len fits within the model's maximum sequence length.",
        check=check_seq_len,
        fix="Lower data.seq_len or raise the model's max_seq_len option.",
    ),
    Rule(
        id="parallel.metadata-reaches-layers",
        severity="error",
        paths=("parallel.pp", "data.packer"),
        summary=(
            "Per-token metadata a packer emits (doc_ids, positions) must reach every layer under every "
            "active strategy; a strategy that declares it drops them is refused with document-isolating "
            "packing."
        ),
        check=check_metadata_forwarded,
        fix=(
            "Use a packer that does not isolate documents (data.packer: none, or concat with "
            "data.packer_options.isolate: false), or switch off the strategy that drops them."
        ),
        fix_for=metadata_fix_for,
    ),
    Rule(
        id="parallel.model-supports-strategy",
        severity="error",
        paths=("model.name", DEGREES, "parallel.wrappers"),
        summary=(
            "Every active parallelism strategy finds what it requires in the model's declared "
            "parallel contract."
        ),
        check=check_model_supports_strategies,
        fix="Set the strategy's degree back to 1 (or drop the wrapper), or choose a model whose spec "
        "supports it. Model authors: declare the piece in ModelSpec.supports and supply it from the "
        "model's parallel_contract() (forge_core.api.ParallelContract).",
    ),
    Rule(
        id="train.loss-needs-output-head",
        severity="error",
        paths=("train.loss.name", "model.name"),
        summary="The chunked loss needs a model that declares its output head.",
        check=check_loss_finds_head,
        fix="Set train.loss.name: full, or choose a model that supports it. Model authors: declare "
        "OUTPUT_HEAD in ModelSpec.supports and name the head in parallel_contract().output_head "
        "(forge_core.api.ParallelContract).",
    ),
    Rule(
        id="train.objective-under-pipeline",
        severity="error",
        paths=("train.objective", "parallel.pp"),
        summary="An objective that does not declare pipeline runs without pipeline parallelism.",
        check=check_objective_under_pipeline,
        fix="Set parallel.pp: 1 (shard with parallel.dp_shard or parallel.tp instead), or use an objective "
        "whose spec declares pipeline (train.objective: lm).",
    ),
    Rule(
        id="train.objective-needs-logits",
        severity="error",
        paths=("train.objective", "train.loss.name"),
        summary="An objective that does not declare hidden_states needs the full loss (the logits).",
        check=check_objective_takes_output,
        fix="Set train.loss.name: full.",
    ),
    Rule(
        id="train.objective-under-token-split",
        severity="error",
        paths=("train.objective", DEGREES),
        summary="An objective that does not declare token_split runs without context parallelism.",
        check=check_objective_under_token_split,
        fix="Set parallel.cp: 1 (shorter rows, or parallel.dp_shard for memory), or use an objective whose "
        "spec declares token_split (train.objective: lm).",
    ),
    Rule(
        id="train.objective-needs-metadata",
        severity="error",
        paths=("train.objective", "data.packer"),
        summary="The packer emits the per-token metadata the objective needs.",
        check=check_objective_needs,
        fix="Choose a packer that emits it (data.packer: bfd emits doc_ids and positions).",
    ),
    Rule(
        id="attention.honours-doc-ids",
        severity="error",
        paths=("data.packer", "attention.backend"),
        summary="A packer that emits doc_ids needs an attention backend that honours them.",
        check=check_honours_doc_ids,
        fix="Choose a backend whose spec honours doc_ids (the built-in sdpa, flex and eager "
        "do), or a packer that does not isolate documents.",
    ),
    Rule(
        id="run.out-dir",
        severity="error",
        paths=("run.out_dir",),
        summary="The run directory is a directory this user can create or write.",
        check=check_out_dir,
        fix="Point run.out_dir at a writable directory (it is created when missing).",
    ),
    Rule(
        id="model.accepts-metadata",
        severity="error",
        paths=("model.name", "data.packer"),
        summary="The model takes every per-token metadata key the packer emits.",
        check=check_model_accepts,
        fix="Choose a packer that emits only what the model accepts, or a model that accepts it.",
    ),
    Rule(
        id="data.chat-pairs-isolated",
        severity="error",
        paths=("data.chat.format", "data.packer"),
        summary="Preference pairs are packed by a packer that emits doc_ids (chosen and rejected "
        "never attend to each other).",
        check=check_pairs_isolated,
        fix="Set data.packer: bfd (it keeps every pair whole in one row, each half its own document).",
    ),
    Rule(
        id="data.stream-one-source",
        severity="error",
        paths=("data.stream.enabled", "data.sources"),
        summary="A stream is one source: a mixture of sources is read from the token cache.",
        check=check_stream_one_source,
        fix="Stream one source (data.source), or mix sources without streaming (data.stream.enabled: "
        "false and no source's streaming option).",
    ),
    Rule(
        id="data.stream-heldout",
        severity="error",
        paths=("data.stream.enabled", "data.heldout.fraction"),
        summary="A stream has no held-out split.",
        check=check_stream_heldout,
        fix="Set data.heldout.fraction: 0 and evaluate on another source (eval.source), or do not stream.",
    ),
    Rule(
        id="data.stream-chat",
        severity="error",
        paths=("data.stream.enabled", "data.chat.format"),
        summary="Chat data is not streamed.",
        check=check_stream_chat,
        fix="Do not stream chat data (data.stream.enabled: false, and the source's streaming option off).",
    ),
    Rule(
        id="data.stream-workers",
        severity="error",
        paths=("data.stream.enabled", "data.num_workers"),
        summary="A stream is read by its own thread, not by loader worker processes.",
        check=check_stream_workers,
        fix="Set data.num_workers: 0 (data.stream.ahead sets how far the stream reads ahead).",
    ),
    Rule(
        id="data.stream-window",
        severity="error",
        paths=("data.stream.window_tokens", "data.seq_len"),
        summary="A stream's window holds at least two rows.",
        check=check_stream_window,
        fix="Raise data.stream.window_tokens to at least 2 * data.seq_len.",
    ),
    Rule(
        id="train.batch-divisible",
        severity="error",
        paths=("train.batch_size", "train.grad_accum", DEGREES),
        summary="The global batch splits evenly over data-parallel ranks and accumulation steps.",
        check=check_batch_divisible,
        fix=(
            "Make train.batch_size a multiple of the data-parallel ranks (dp_replicate * dp_shard, "
            "times ep under expert parallelism) * grad_accum."
        ),
    ),
    Rule(
        id="eval.heldout-available",
        severity="error",
        paths=("eval.enabled", "eval.source", "data.heldout.fraction"),
        summary="Evaluation on the held-out split needs documents held out of training.",
        check=check_eval_heldout,
        fix="Hold documents out with data.heldout.fraction (e.g. 0.01), or evaluate on another "
        "source with eval.source.",
    ),
    Rule(
        id="eval.batch-divisible",
        severity="error",
        paths=(
            "eval.batch_size",
            "train.batch_size",
            "train.grad_accum",
            DEGREES,
        ),
        summary="The evaluation batch splits evenly over data-parallel ranks.",
        check=check_eval_batch,
        fix=(
            "Make eval.batch_size a multiple of the data-parallel ranks (dp_replicate * dp_shard, "
            "times ep under expert parallelism); 0 takes the training micro-batch."
        ),
    ),
    Rule(
        id="train.bf16-on-cpu",
        severity="error",
        paths=("train.precision", "run.device"),
        summary="bf16 on the CPU needs native bf16 arithmetic (AVX512_BF16 or AMX), read from /proc/cpuinfo.",
        check=check_bf16_on_cpu,
        fix=BF16_FIX,
    ),
    Rule(
        id="train.bf16-on-auto-device",
        severity="warning",
        paths=("train.precision", "run.device"),
        summary="bf16 with run.device: auto on a machine with no visible GPU and a CPU without native bf16.",
        check=check_bf16_on_auto_device,
        fix=BF16_FIX,
    ),
    Rule(
        id="model.transforms-once",
        severity="error",
        paths=("model.transforms",),
        summary="Each model transform is listed once in model.transforms.",
        check=check_transforms_once,
        fix="List each transform once.",
    ),
    Rule(
        id="model.transform-options-used",
        severity="warning",
        paths=("model.transforms", "model.transform_options"),
        summary="Options in model.transform_options are for transforms model.transforms lists.",
        check=check_transform_options_used,
        fix="Add the transform to model.transforms, or remove its options.",
    ),
    Rule(
        id="model.adapters-from-needs-adapters",
        severity="error",
        paths=("model.init_adapters_from", "model.transforms"),
        summary="A run starts from another run's adapters only under a transform that keeps adapters.",
        check=check_adapters_from,
        fix="List the transform the other run used (model.transforms: [lora], with its "
        "transform_options), or remove model.init_adapters_from.",
    ),
    Rule(
        id="eval.scheduled",
        severity="warning",
        paths=("eval.enabled", "eval.every", "eval.at_end", "train.steps"),
        summary="An enabled evaluation runs at least once.",
        check=check_eval_scheduled,
        fix="Set eval.every to a number of steps up to train.steps, or eval.at_end: true.",
    ),
    Rule(
        id="eval.every-needs-enabled",
        severity="warning",
        paths=("eval.enabled", "eval.every"),
        summary="A cadence of evaluation (eval.every) is set only where evaluation is enabled.",
        check=check_eval_every_enabled,
        fix="Set eval.enabled: true to evaluate at that cadence (on held-out documents: "
        "data.heldout.fraction, or eval.source), or eval.every: 0 to leave it off.",
    ),
]


@hookimpl
def forge_rules():
    return RULES
