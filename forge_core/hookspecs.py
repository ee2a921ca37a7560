"""The hook contract between Forge and its plugins (pluggy project name ``forge``).

Each hook's docstring is its reference documentation; ``docs/hooks.md`` reproduces every
signature and a test fails when the two drift apart. Registration hooks return lists of
spec objects (:mod:`forge_core.api`) and must not import heavy libraries: they run for
``forge-run check``. Lifecycle hooks are called by the trainer on every process; use
``run.is_main`` to act on one process only.

Write an implementation with ``forge_core.api.hookimpl`` and give its parameters no
defaults. A hookimpl may accept any subset of the hook's arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forge_core.api.hooks import hookspec as _hookspec

if TYPE_CHECKING:
    from forge_core.api import (
        AttentionBackendSpec,
        LoggerSpec,
        ModelSpec,
        ObjectiveSpec,
        OptimizerSpec,
        PackerSpec,
        ParallelismSpec,
        Rule,
        RunContext,
        ScheduleSpec,
        SourceSpec,
        TokenizerSpec,
        TransformSpec,
    )


# --- registration hooks -------------------------------------------------------------


@_hookspec
def forge_attention_backends() -> list[AttentionBackendSpec]:
    """Register attention backends, selected by ``attention.backend``.

    Return a list of :class:`~forge_core.api.AttentionBackendSpec`. The implementation
    (``impl``) is a class constructed as ``cls(options)`` with two methods:
    ``prepare(doc_ids, seq_len, device)``, called once per model forward to build whatever
    mask the backend needs (shared by every layer), and ``attend(q, k, v, prepared)``
    with ``q`` of shape ``(batch, heads, seq, head_dim)`` and ``k``/``v`` of shape
    ``(batch, kv_heads, seq, head_dim)``, returning the shape of ``q``. Declare
    ``honours={"doc_ids"}`` only if ``attend`` masks attention across documents. A
    backend that attends fewer pairs than causal attention within documents (a sliding
    window) may say how many with ``attended_pairs(doc_ids, rows, seq_len) -> int``,
    which the trainer's MFU counts (:class:`~forge_core.api.AttentionBackend`).

    Example::

        @hookimpl
        def forge_attention_backends():
            return [AttentionBackendSpec(name="window", summary="Sliding-window attention",
                                         impl="my_pkg.window:WindowAttention",
                                         options=WindowOptions, honours={"doc_ids"})]
    """


@_hookspec
def forge_parallelisms() -> list[ParallelismSpec]:
    """Register parallelism strategies and model wrappers.

    Return a list of :class:`~forge_core.api.ParallelismSpec`. A strategy is active
    when the ``parallel.<mesh_dim>`` degree is above 1 (or, for a wrapper with
    ``mesh_dim=None``, when it is named in ``parallel.wrappers`` or its ``enabled_by``
    setting is true). Active strategies are applied in ascending ``order``. The
    implementation is a class constructed as ``cls(options)`` with ``apply(model, ctx)
    -> model`` where ``ctx`` is a :class:`forge_core.api.ParallelContext`: its options
    and the run facts a strategy needs, not the config. A strategy that splits
    the model (pipeline parallelism) returns a
    :class:`forge_core.api.ModelSplit` instead: later strategies are then
    applied to each part, and its ``finalize`` sets the ``train_step(batch, loss_fn,
    normalizer) -> (loss_sum, tokens)`` that does forward and backward. Gradients are
    summed over ranks, never averaged (`the gradient convention
    <plugin-guide/parallelism.md#the-gradient-convention>`_). Declare in ``forwards``
    which per-token metadata still reaches every layer once the strategy is applied: the rule engine
    rejects a packer whose metadata would be lost, and in ``requires`` the pieces of
    the model's parallel contract the strategy uses (a model that lacks one is refused).
    A strategy that must reduce gradients once per optimizer step, after the last
    backward and before clipping, registers a callback with
    ``ctx.add_gradient_finisher``; one whose wrapper reduces them in the backward
    declares how to skip that on all but a step's last micro-batch with
    ``ctx.add_gradient_sync``.

    Example::

        @hookimpl
        def forge_parallelisms():
            return [ParallelismSpec(name="act_offload", summary="Activation offloading",
                                    impl="my_pkg.offload:OffloadActivations", order=260)]
    """


@_hookspec
def forge_packers() -> list[PackerSpec]:
    """Register data packers, selected by ``data.packer``.

    Return a list of :class:`~forge_core.api.PackerSpec`. The implementation is a
    class constructed as ``cls(options, seq_len=..., eos_id=..., pad_id=...)`` whose
    ``layout(lengths)`` takes the length of every document (1-D int64, EOS included)
    and returns a :class:`~forge_core.api.RowLayout`: which runs of
    the document stream go into which row, and how labels and metadata follow
    (``boundaries``, ``metadata``). It reads no token; Forge materializes ``input_ids``,
    ``labels`` (-100 where no loss is taken) and, with ``metadata``, ``doc_ids`` and
    ``positions`` when a batch is read. ``metadata`` must match ``emits``.

    Example::

        @hookimpl
        def forge_packers():
            return [PackerSpec(name="greedy", summary="Greedy first-fit packing",
                               impl="my_pkg.greedy:GreedyPacker",
                               emits={"doc_ids", "positions"})]
    """


@_hookspec
def forge_models() -> list[ModelSpec]:
    """Register model families, selected by ``model.name``.

    Return a list of :class:`~forge_core.api.ModelSpec`. The implementation is a
    factory the trainer calls as ``build(options, vocab_size=..., attention=...)``:
    ``options`` is the structured ``model.options`` block, ``vocab_size`` the
    tokenizer's vocabulary size, and ``attention`` the constructed backend of
    ``attention.backend`` (:class:`~forge_core.api.AttentionBackend`). It returns a
    ``torch.nn.Module`` that meets the model contract, stated in code as protocols:
    :class:`~forge_core.api.Model` (``forward(input_ids, **metadata)`` returning
    logits, the metadata being the keywords the spec's ``accepts`` lists; attention only
    through the backend), :class:`~forge_core.api.ParallelModule`
    (``parallel_contract()``, when the spec's ``supports`` names pieces of it),
    :class:`~forge_core.api.PretrainedModel` (``init_weights()``, with a
    ``pretrained_option``) and :class:`~forge_core.api.CachingModel` (``new_cache`` and
    ``forward(..., cache=)``, for sampling with a key/value cache). Their docstrings say
    what each piece receives and must do. Parallelism strategies know the model only
    through the spec's ``supports`` and ``facts`` and the module's
    ``parallel_contract()`` (:class:`~forge_core.api.ParallelContract`; a pipeline
    stage is a shallow copy of the model, see
    :class:`~forge_core.api.PipelineSplit`). ``forge_core.testing.check_model`` checks
    the contract (:func:`~forge_core.api.model_contract_gaps`) and the behaviour behind
    it.

    Example::

        @hookimpl
        def forge_models():
            return [ModelSpec(name="tiny", summary="A two-layer test model",
                              impl="my_pkg.tiny:build", options=TinyOptions)]
    """


@_hookspec
def forge_transforms() -> list[TransformSpec]:
    """Register model transforms (adapters), enabled by listing their names in
    ``model.transforms``.

    Return a list of :class:`~forge_core.api.TransformSpec`. The implementation is a
    class constructed as ``cls(options)``, with the structured
    ``model.transform_options.<name>``, that meets :class:`~forge_core.api.ModelTransform`:
    ``apply(model, ctx)`` changes the model in place right after its factory built it,
    before any parallelism strategy, in training and in ``eval``, ``sample`` and
    ``export-hf`` alike; ``ctx`` is a :class:`~forge_core.api.TransformContext` whose
    ``roles`` map the roles the model declares in its parallel contract
    (``"attention.q"``, ``"mlp.up"``, ...) to module paths inside each block: target
    those, never a model's module names. Parameters the transform freezes
    (``requires_grad_(False)``) stay out of the optimizer. ``initialize(module)`` fills
    the transform's own parameters, from ``ctx.seed`` and their names, on the model or a
    pipeline stage of it, whole or sharded (the kernel calls it after the base weights
    are in place, also when the model was built on the meta device); ``detached(module)``
    and ``disabled(module)`` are context managers (the model's parameters as its factory
    built them, for its ``init_weights``; the model computing without the transform, for
    a reference model: :func:`~forge_core.api.transforms_disabled`); ``merge(module)``
    folds the transform into the model's own weights (``export-hf``). With
    ``saves_trainable_only`` on the spec, checkpoints keep only the trainable parameters,
    and the identity of the base weights is recorded and checked on resume.

    Example::

        @hookimpl
        def forge_transforms():
            return [TransformSpec(name="ia3", summary="(IA)^3 scaling vectors",
                                  impl="my_pkg.ia3:IA3", options=IA3Options,
                                  saves_trainable_only=True)]
    """


@_hookspec
def forge_sources() -> list[SourceSpec]:
    """Register data sources, selected by ``data.source`` (or by each entry of a
    ``data.sources`` mixture).

    Return a list of :class:`~forge_core.api.SourceSpec`. The implementation is a
    class constructed as ``cls(options)``, with the structured ``data.source_options``
    (or, in a mixture, once per entry with that entry's ``options``). It has
    ``documents()``, an iterator of ``str`` (or of 1-D integer token arrays when the
    spec says ``pretokenized=True``, or of :class:`~forge_core.api.MaskedDocument`:
    token ids with the mask of those that take a loss) in a deterministic order: the same options give the
    same documents in the same order in every process and run. EOS is appended to every
    document by the pipeline, pre-tokenized ones included: yield none. ``describe()``
    returns a one-line ``str`` for logs and error messages. A pre-tokenized source may
    expose ``tokenizer_identity``: the run stops when it differs from the configured
    tokenizer's ``identity``. A source of data that already is tokens may instead have
    ``token_documents(eos_id)``, returning :class:`~forge_core.api.TokenDocuments`
    (documents as slices of one memory-mapped array): the run reads them in place,
    without the token cache. Optional: ``fingerprint()``, a non-empty ``str`` that
    changes whenever the documents could, computed without tokenizing (a hash of the
    files' bytes: :func:`~forge_core.api.files_fingerprint`): the token cache is keyed
    by it (without it, every document is hashed in one pass at every start). Better,
    for a source that reads files: ``fingerprint_files()``, a
    :class:`~forge_core.api.FileSet`; the cache then hashes each file once and checks
    it by stat at later starts (``forge-run prepare --verify`` hashes again). A source
    does not shard across processes: one process tokenizes it into the cache and the
    loader gives each data-parallel rank its part of every batch. Streamed
    (``data.stream.enabled``, or the spec's ``streaming_option`` set), ``documents()``
    is iterated by a background thread of every process, which keeps every
    data-parallel rank's share of the documents, and is called again at every new pass
    and at a resume; nothing else is needed. Optional, for chat
    data (``data.chat.format``): ``records()``, an iterator of ``(where, record)``: each
    record a ``dict`` of its fields (a JSON object, a data set row) and ``where`` the
    ``str`` its errors start with (``"data/chat.jsonl, line 3"``); the run renders them
    with the tokenizer's ``encode_chat``.

    Example::

        @hookimpl
        def forge_sources():
            return [SourceSpec(name="parquet", summary="Text column of parquet files",
                               impl="my_pkg.parquet:ParquetSource", options=ParquetOptions)]
    """


@_hookspec
def forge_tokenizers() -> list[TokenizerSpec]:
    """Register tokenizers, selected by ``data.tokenizer``.

    Return a list of :class:`~forge_core.api.TokenizerSpec`. The implementation is a
    class constructed as ``cls(options)``, with the structured ``data.tokenizer_options``,
    whose instances have the ``int`` attributes ``vocab_size`` (the model's embedding
    size; every id, the special ones included, lies in ``[0, vocab_size)``), ``eos_id``
    (appended by Forge to every document; never add it in ``encode``) and ``pad_id``
    (fills the unused end of a row, never labelled; may equal ``eos_id``), and
    ``identity``, a ``str`` that changes whenever token ids would (it keys the token
    cache and is saved in checkpoints; resuming with another identity is refused).
    Methods: ``encode(text) -> list[int]`` (a 1-D integer array will do), ``decode(ids)
    -> str`` and ``save(directory) -> None``, called at the start of every run with the
    run's ``tokenizer/`` directory (it exists; writing nothing is fine). Optional:
    ``encode_batch(texts)``, one id sequence per text (used when present, for speed),
    a classmethod ``load(directory)`` returning the tokenizer ``save`` wrote there
    (``forge-run sample`` uses it), and ``save_hf(directory)``, which writes the
    tokenizer as Hugging Face files (``tokenizer.json``, ``tokenizer_config.json``) that
    ``AutoTokenizer`` loads with the same ids (``forge-run export-hf`` ships them with
    the model); without it, the run's saved files are copied when they hold a
    ``tokenizer.json``. For chat data (``data.chat``): ``encode_chat(messages, *,
    train_from=0, template=None)``, the conversation rendered by the chat template (the
    file ``template``, else the tokenizer's own) as a
    :class:`~forge_core.api.MaskedDocument` whose trainable tokens are those of the
    assistant messages from index ``train_from`` on (no EOS: Forge appends it), and
    ``chat_identity(template=None)``, a ``str`` that changes whenever the rendering
    would (it keys the token cache); ``render_chat(messages, *,
    add_generation_prompt=False, template=None)``, the rendered text (``forge-run sample
    --chat`` encodes it with ``encode``, which must read special tokens written in the
    text as themselves). ``decode_special(ids)``: the text with special tokens written
    out (``forge-run preview``; without it, ``decode``).

    Example::

        @hookimpl
        def forge_tokenizers():
            return [TokenizerSpec(name="chars", summary="One token per character",
                                  impl="my_pkg.chars:CharTokenizer")]
    """


@_hookspec
def forge_optimizers() -> list[OptimizerSpec]:
    """Register optimizers, selected by ``train.optimizer``.

    Return a list of :class:`~forge_core.api.OptimizerSpec`. The implementation is a
    factory called as ``build(named_params=..., lr=..., options=...)`` returning a
    ``torch.optim.Optimizer``, once per model part this process trains (one, or one per
    pipeline stage). ``named_params`` is a list of
    :class:`~forge_core.api.NamedParameter`, every trainable parameter of
    the part in ``named_parameters()`` order, each with its ``name``, ``param`` and
    ``role`` (``embedding``, ``bias``, ``norm``, ``vector`` or ``matrix``, decided from
    the owning module's type and the parameter's shape, or by the model's
    ``param_roles()``) and ``in_block`` (inside one of the blocks the model's parallel
    contract names: how ``muon`` tells the hidden layers' matrices from the embedding and
    the output head); ``p.decays(embeddings)`` says whether weight decay applies, and
    keeping it off the others is the factory's job (separate parameter groups). ``lr``
    is ``train.lr`` and ``options`` the structured ``train.optimizer_options``. Before
    every step the trainer sets ``group["lr"]`` of every parameter group to ``train.lr``
    times the schedule's factor, so a per-group multiplier must live under another key;
    the optimizer's ``state_dict()`` is saved in checkpoints and loaded on resume. A
    factory that cannot be called with ``named_params=`` is refused, naming this call.

    Example::

        @hookimpl
        def forge_optimizers():
            return [OptimizerSpec(name="lion", summary="Lion", impl="my_pkg.lion:build",
                                  options=LionOptions)]

        # my_pkg/lion.py
        def build(named_params, lr, options):
            decay = [p.param for p in named_params if p.decays()]
            rest = [p.param for p in named_params if not p.decays()]
            return Lion([{"params": decay, "weight_decay": options.weight_decay},
                         {"params": rest, "weight_decay": 0.0}], lr=lr)
    """


@_hookspec
def forge_schedules() -> list[ScheduleSpec]:
    """Register learning-rate schedules, selected by ``train.schedule``.

    Return a list of :class:`~forge_core.api.ScheduleSpec`. The implementation is a
    pure function called as ``factor(step, total_steps, warmup_steps, options)``,
    returning a ``float``: the multiplier applied to ``train.lr`` at ``step`` (0-based:
    logged step ``n`` used ``factor(n - 1, ...)``). Being a function of the step alone, a
    schedule needs no state to resume. ``total_steps`` is the span of the schedule
    (``train.schedule_steps``, by default the ``train.steps`` the run started with);
    ``step`` is always below it: past the end the trainer keeps the final value.
    ``warmup_steps`` is ``train.warmup_steps`` and ``options`` the structured
    ``train.schedule_options``.

    Example::

        @hookimpl
        def forge_schedules():
            return [ScheduleSpec(name="inverse_sqrt", summary="1/sqrt(step) decay",
                                 impl="my_pkg.sched:inverse_sqrt")]
    """


@_hookspec
def forge_objectives() -> list[ObjectiveSpec]:
    """Register training objectives, selected by ``train.objective``.

    Return a list of :class:`~forge_core.api.ObjectiveSpec`. The implementation is a
    class constructed as ``cls(options, token_loss=...)``: ``options`` is the structured
    ``train.objective_options`` and ``token_loss`` the run's token cross-entropy,
    ``token_loss(output, labels) -> (loss_sum, tokens)`` (over the logits, or over the
    hidden states under ``train.loss.name: chunked``). An instance has:

    - ``count(batch) -> int``: what the step's normalizer counts in one micro-batch
      (labelled tokens for ``lm``, preference pairs for ``dpo``), read on the host before
      the batch moves to the device; the step divides every micro-batch's loss sum by
      the sum of the counts over the micro-batches and data-parallel ranks (`the
      gradient convention <plugin-guide/parallelism.md#the-gradient-convention>`_);
    - ``needs_reference``: a ``bool``, whether ``loss`` wants a frozen reference model's
      output (the model as it was at the start, or with a model transform's adapters
      off);
    - ``loss(output, batch, reference) -> (loss_sum, count, sums)``: ``output`` is what
      the model returned for ``batch`` (which holds ``labels`` and every key the
      packer emits, as well as the spec's ``batch_keys``, which the model does not
      receive), ``reference`` the reference model's output for the same inputs (no
      gradient) or ``None``; ``loss_sum`` is a scalar tensor summed over what ``count``
      counts, and ``sums`` maps each of the spec's ``metrics`` to its sum over the same
      units (the step logs each divided by the global count).

    Example::

        @hookimpl
        def forge_objectives():
            return [ObjectiveSpec(name="focal", summary="Focal loss over tokens",
                                  impl="my_pkg.focal:FocalLoss", options=FocalOptions,
                                  pipeline=False)]
    """


@_hookspec
def forge_loggers() -> list[LoggerSpec]:
    """Register loggers, enabled by listing their names in ``logging.loggers``.

    Return a list of :class:`~forge_core.api.LoggerSpec`. The implementation is a
    class constructed as ``cls(options)``, with the structured
    ``logging.options.<name>``, only when its name is in ``logging.loggers``; the
    trainer registers the instance with the plugin manager for the length of the run, so
    it receives the lifecycle hooks below by implementing them as methods decorated with
    :data:`hookimpl`.

    Example::

        @hookimpl
        def forge_loggers():
            return [LoggerSpec(name="csv", summary="Metrics as CSV", impl="my_pkg.csv:CsvLogger")]
    """


@_hookspec
def forge_rules() -> list[Rule]:
    """Register compatibility rules, evaluated by ``forge-run check`` before a run.

    Return a list of :class:`~forge_core.api.Rule`. Every rule's ``check`` is called
    as ``check(ctx)`` with a :class:`~forge_core.api.Plan` (the resolved config, the
    chosen specs, the active strategies, the world size) and returns ``None`` (or an
    empty list) when satisfied, else a ``str`` message (or a list of them) explaining
    what is wrong; the engine adds the rule's ``paths`` with their values and its
    ``fix``. Declare a rule next to the component whose limit it describes.

    Example::

        @hookimpl
        def forge_rules():
            return [Rule(id="window.seq-len", severity="error", paths=("data.seq_len",),
                         summary="Window must not exceed the sequence length",
                         check=lambda ctx: None, fix="Lower the window")]
    """


# --- lifecycle hooks ----------------------------------------------------------------


@_hookspec
def forge_train_start(run: RunContext) -> None:
    """Called once on every process after everything is built, before the first step.

    ``run`` is a :class:`~forge_core.api.RunContext`: the resolved config, the
    run directory, the first step (above 0 after a resume), rank and world size. Its
    return value is ignored.
    """


@_hookspec
def forge_step_end(run: RunContext, step: int, metrics: dict[str, Any]) -> None:
    """Called on every process after every optimizer step, with the ``run`` given to
    ``forge_train_start``. Its return value is ignored.

    ``step`` counts optimizer steps from 1. ``metrics`` holds at least ``loss``,
    ``lr``, ``grad_norm``, ``tokens`` (tokens with a label, summed over all processes),
    ``tokens_per_s``, ``mfu`` (at most 1), ``mfu_capped`` (true when the step computed
    faster than the run's peak, which is then too low, and ``mfu`` reads 1),
    ``step_time`` (seconds), ``skipped`` (true when a
    non-finite loss skipped the update) and peak memory in GiB: ``mem_rss_peak_gib``
    (this process's resident-memory high-water mark since it started), on Linux
    ``mem_rss_anon_gib`` (its anonymous resident memory now, file-backed pages such as
    the memory-mapped token cache left out) and, on CUDA,
    ``mem_cuda_allocated_peak_gib`` and ``mem_cuda_reserved_peak_gib`` (peaks since the
    previous logged step), each also as ``<key>_max``, the largest over all processes.
    With several sources (``data.sources``), ``data/<source>/tokens`` (this step's
    labelled tokens read from each source, over all processes) and ``data/<source>/share``
    (that source's share of the labelled tokens since the run started), and under
    ``data.phases`` ``data/<source>/phase_share`` (its share since the step's phase
    started), so the mixture the run really trained on is on record. The objective's
    metrics (its spec's ``metrics``: ``dpo/reward_accuracy``, ``dpo/chosen_reward``, ``dpo/rejected_reward``,
    ``dpo/reward_margin`` under ``train.objective: dpo``), each a mean over what the
    objective counts; ``loss`` is then the objective's mean over the same count (per
    pair for ``dpo``). Plugins add their own through ``forge_step_metrics``. It is a
    fresh dict, safe to keep. A logger that reports to another system should forward
    every key it gets, not a fixed list: other keys may be added.
    """


@_hookspec
def forge_eval_end(run: RunContext, step: int, metrics: dict[str, Any]) -> None:
    """Called on every process after every evaluation: during training (``eval.every``,
    ``eval.at_end``; before ``forge_step_end`` of the same step, whose ``metrics`` then
    carry the same keys) and by ``forge-run eval`` (``step``: the checkpoint's); ``run``
    is the run's :class:`~forge_core.api.RunContext`. Its return value is ignored.

    ``metrics`` holds ``eval/loss`` (mean cross-entropy per labelled token, over every
    process), ``eval/perplexity`` (its exponential) and ``eval/tokens`` (labelled tokens
    evaluated); with several sources also ``eval/<source>/loss`` and
    ``eval/<source>/perplexity``. Under an objective other than the token cross-entropy
    (``train.objective: dpo``), ``eval/loss`` is its mean over what it counts, reported as
    ``eval/<unit>`` (``eval/pairs``) with ``eval/<metric>`` for each of its metrics and no
    perplexity. It is a fresh dict, safe to keep.

    ``run.view`` (:class:`forge_core.train.view.RunView`) reaches the model, the step and
    the data read-only, so a plugin can run an evaluation of its own here. Every process
    is called: a forward under a parallel layout needs them all. Example, the accuracy of
    next-token prediction on the held-out documents (one process, one piece)::

        class NextTokenAccuracy:
            @hookimpl
            def forge_eval_end(self, run, step, metrics):
                view = run.view
                if view.model is None or run.world_size > 1:
                    return  # split over pipeline stages or processes: use view.evaluate
                hits = total = 0
                with view.inference():
                    for _, docs in view.heldout_documents():
                        for d in range(min(len(docs), 8)):
                            ids, _ = docs.gather(np.arange(docs.offsets[d], docs.offsets[d + 1]))
                            ids = torch.as_tensor(ids[: view.seq_len + 1], device=view.device)
                            logits = view.model(ids[None, :-1])
                            hits += int((logits[0].argmax(-1) == ids[1:]).sum())
                            total += len(ids) - 1
                print(f"step {step}: next-token accuracy {hits / max(total, 1):.1%}")
    """


@_hookspec
def forge_step_metrics(run: RunContext, step: int, metrics: dict[str, Any]) -> dict[str, float] | None:
    """Add metrics of your own to a step: called on every process after every optimizer
    step (and after that step's ``forge_eval_end``), before ``forge_step_end``, with the
    ``run`` given to ``forge_train_start``. Return a ``dict`` of metric name to number
    (``int``, ``float`` or ``bool``; a NumPy scalar is taken as a ``float``), or ``None``
    to add nothing at this step.

    What every process returns joins that step's ``metrics`` for ``forge_step_end``, so
    every logger receives it like a built-in metric: a key of the step's line in
    ``metrics.jsonl`` (non-finite numbers as ``null``), a scalar in TensorBoard, W&B and
    MLflow (a name without ``/`` as ``train/<name>``). Loggers report what the main
    process returns and only on the steps they log (``run.should_log(step)``): compute an
    expensive metric on those steps alone, and reduce it over processes yourself when it
    differs between them (every process is called, so a collective is safe here).

    ``step`` counts optimizer steps from 1. ``metrics`` is the step's metrics so far
    (what ``forge_step_end`` documents, the evaluation's on a step that evaluated),
    read-only. A name Forge already reports, or one another plugin returned at the same
    step, stops the run with an error naming both: prefix yours with the plugin's name
    (``myplugin/accuracy``). A value that is not a number stops it too (a tensor: call
    ``.item()``).

    Example, throughput per process and the accuracy an evaluator measured in
    ``forge_eval_end`` on the same step::

        class PerProcess:
            def __init__(self):
                self.accuracy = None

            @hookimpl
            def forge_eval_end(self, run, metrics):
                self.accuracy = my_accuracy(run.view)

            @hookimpl
            def forge_step_metrics(self, run, metrics):
                added = {"perf/tokens_per_s_per_process": metrics["tokens_per_s"] / run.world_size}
                if self.accuracy is not None:
                    added["eval/my_accuracy"], self.accuracy = self.accuracy, None
                return added
    """


@_hookspec
def forge_checkpoint_writing(run: RunContext, step: int, path: str) -> None:
    """Called on every process while the checkpoint of ``step`` is being written: the
    model, optimizer and train state are in ``path`` (a ``str``, the temporary directory
    ``.tmp-step-N`` that becomes the checkpoint once complete), its manifest is not
    written yet and ``latest`` still names the previous checkpoint; ``run`` is the
    run's :class:`~forge_core.api.RunContext`. Its return value is ignored.

    Files a plugin writes directly in ``path`` are part of the checkpoint: listed in its
    manifest with their SHA-256, verified before a resume trusts it, kept and pruned
    with it. Give them names of your own (prefixed with the plugin's name; on several
    processes, one per rank or written by ``run.is_main`` only), never ``.metadata``,
    ``*.distcp``, ``train_state-*`` or ``manifest.json``; subdirectories are not covered
    by the manifest. An exception raised here fails the save as a failed write does:
    the partial checkpoint is removed, ``latest`` keeps naming the previous one, and
    the run stops with the error. Every process waits for the others after this hook,
    so a slow implementation delays the save, not the correctness of the checkpoint.
    With ``checkpoint.async: true`` it is called at the step of the save with the train
    state in ``path`` and before the model and optimizer files, which are written in
    the background afterwards; the files it writes are flushed to disk and listed in
    the manifest with them.

    Example, the data pipeline's own position saved with the weights::

        class SaveCursor:
            @hookimpl
            def forge_checkpoint_writing(self, run, step, path):
                if run.is_main:
                    Path(path, "my_cursor.json").write_text(json.dumps({"step": step}))
    """


@_hookspec
def forge_checkpoint_saved(run: RunContext, step: int, path: str) -> None:
    """Called on every process after a checkpoint is complete and the ``latest``
    pointer has moved to ``path`` (a ``str``, the checkpoint's directory), the one of
    ``step``; ``run`` is the run's :class:`~forge_core.api.RunContext`. Its return value
    is ignored. With ``checkpoint.async: true`` that is later than the step of the save:
    at the end of the first step that finds the background write complete (each process
    on its own), else before the next save or the end of the run."""


@_hookspec
def forge_train_end(run: RunContext, step: int, status: str) -> None:
    """Called once on every process when the run ends, with the run's ``run`` and the
    last ``step`` taken. ``status`` is ``"completed"``, ``"interrupted"`` (SIGTERM/SIGINT,
    after the final checkpoint) or ``"failed"``. Its return value is ignored."""
