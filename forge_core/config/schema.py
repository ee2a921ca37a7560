"""The config schema: frozen attrs classes, one per top-level section.

Every field is an :func:`~forge_core.api.option`, which carries its meaning;
``docs/configuration.md`` is generated from these classes and a test keeps it current.
A component is named only by its registered name (``model.name: llama``); its own
settings live in the sibling option block (``model.options``), structured against the
options class its spec declares.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from forge_core.api import above, at_least, between, max_chars, non_blank, option, path_fits, satisfies
from forge_core.kinds import KINDS, Kind

#: Longest name that becomes a tracker's field (W&B refuses a project name past 128).
NAME_CHARS = 128


@attrs.frozen
class RunSection:
    name: str = option(
        "forge",
        "Name of the run, shown in logs; the trackers' default project or experiment and run name.",
        validator=max_chars(NAME_CHARS),
    )
    out_dir: str = option(
        "runs/forge",
        "Run directory: checkpoints, metrics, plots, tokenizer.",
        validator=attrs.validators.and_(non_blank, path_fits),
    )
    seed: int = option(0, "Seed for model init, data order and dropout.", validator=at_least(0))
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "Where to train: 'auto' takes CUDA when available, else CPU."
    )
    world_size: int | None = option(
        None,
        "The number of processes this config is made for (what its degrees, batch and memory "
        "per GPU assume), or null for any. `forge-run check` judges against it when no "
        "`--world-size` is given; `check --world-size N` and a run of N processes refuse "
        "another N. Launch that many (`forge-run --nproc N`, or `srun` with N tasks), or "
        "override it (`run.world_size=N`) to run the config at another size.",
        validator=satisfies("at least 1 (or null: any)", lambda v: v is None or at_least(1).test(v)),
    )
    collective_timeout: float = option(
        0.0,
        "Seconds a collective (all-reduce, gather, barrier) waits for the other processes "
        "before the job stops with an error naming the rank that stopped answering. 0 picks "
        "300 on CPU (gloo) and 600 on CUDA (nccl, torch's default). Raise it if one process "
        "legitimately works alone longer than that (a very slow checkpoint save).",
        validator=at_least(0),
    )
    requeue_signal: Literal["", "USR1", "USR2", "HUP", "XCPU"] = option(
        "USR1",
        "A signal that stops the run like SIGTERM: a checkpoint at the next step boundary, then "
        "exit 128 + the signal (138 for USR1). The one a scheduler sends before the time limit so "
        "that the job can be requeued and resume (Slurm: `--signal=USR1@120`; see "
        "docs/multi-node.md). '' leaves it to its default action. TERM and INT always stop; they "
        "are not choices because `scancel` sends TERM too, and a cancelled job must not requeue.",
    )


@attrs.frozen
class ModelSection:
    name: str = option("llama", "Registered model name (`forge-run plugins` lists them).")
    options: Any = option({}, "The model's own options, checked against its options class.")
    transforms: list[str] = option(
        [],
        "Registered model transforms (adapters such as `lora`) applied to the model, in this "
        "order, right after it is built: in training and in `eval`, `sample` and `export-hf`.",
    )
    transform_options: dict[str, Any] = option({}, "Per-transform options, keyed by transform name.")
    init_adapters_from: str = option(
        "",
        "Start the adapters of `model.transforms` (LoRA) from another run's: its run directory "
        "(its latest complete checkpoint) or one of its checkpoints (`.../checkpoints/step-000400`). "
        "That checkpoint must hold adapters on the same base and with the same settings (LoRA's "
        "targets, rank and alpha), or the run is refused saying what differs. The run is new: "
        "step 0, a fresh optimizer and schedule; once it has checkpoints of its own, it resumes from "
        "those. A `dpo` reference is then the model as the run starts, with these adapters (SFT -> DPO). "
        "Empty: adapters start as the transform initialises them.",
    )


@attrs.frozen
class AttentionSection:
    backend: str = option("sdpa", "Registered attention backend: sdpa, flex, eager, ...")
    options: Any = option({}, "The backend's own options.")


@attrs.frozen
class SourceEntry:
    name: str = option("", "Registered data source of this part of the mixture.", validator=non_blank)
    weight: float = option(
        1.0,
        "Its share of the training rows: weights are divided by their sum, so 7 and 3 "
        "mean 70% and 30%, whatever the sources' sizes (a small source is repeated, a large "
        "one sampled).",
        validator=satisfies(
            "above 0 (its share of the rows, such as 1; leave an entry out rather than weigh it 0)",
            above(0).test,
        ),
    )
    options: Any = option({}, "The source's own options, checked against its options class.")
    label: str = option(
        "",
        "Its name in the logs and the data summary (default: the source's name, numbered "
        "when two entries share it).",
        validator=max_chars(NAME_CHARS),
    )


@attrs.frozen
class PhaseEntry:
    start_step: int = option(
        0,
        "Optimizer steps trained before this phase's weights apply: 0 is the first step, "
        "100 the 101st (a checkpoint at step 100 resumes into it). Each phase starts after "
        "the one before it and runs until the next one starts (the last one, to the end).",
        validator=at_least(0),
    )
    weights: dict[str, float] = option(
        {},
        "Every source's weight in this phase, keyed by its label (the names the logs "
        "use: `data.sources[i].label`, else its name, numbered `name#i` when two entries "
        "share it). 0 leaves the source out of the phase; divided by their sum like "
        "`data.sources[i].weight`.",
    )
    anneal_steps: int = option(
        0,
        "Reach these weights linearly over this many steps from the phase's start, from "
        "the weights before it (the previous phase's, or `data.sources`' for the first). "
        "0: switch at once. At most the phase's length.",
        validator=at_least(0),
    )


def source_labels(entries: Any) -> list[str]:
    """Each source's name in the logs: its ``label``, else its ``name``, numbered
    (``name#i``) when two entries share it."""
    names = [e.name for e in entries]
    return [
        e.label or (n if names.count(n) == 1 else f"{n}#{i}") for i, (e, n) in enumerate(zip(entries, names))
    ]


@attrs.frozen
class HeldoutSection:
    fraction: float = option(
        0.0,
        "Share of documents held out of training, chosen by a hash of each document's "
        "content (so a document stays on its side when the corpus grows, and identical "
        "documents share a side). 0: none.",
        validator=between(0, 1, high_open=True),
    )
    seed: int = option(0, "Changes which documents are held out (not how many).", validator=at_least(0))


@attrs.frozen
class CacheSection:
    dir: str = option(
        "",
        "Where tokenized sources are cached ('' means $FORGE_CACHE_DIR/data, else "
        "$XDG_CACHE_HOME/forge/data, else ~/.cache/forge/data). Entries are keyed by the "
        "source's content, the tokenizer's identity and the format version.",
        validator=path_fits,
    )
    wait_s: float = option(
        3600.0,
        "How long a process waits for another one that is tokenizing the same source "
        "into the cache before it gives up with an error.",
        validator=above(0),
    )


@attrs.frozen
class StreamSection:
    enabled: bool = option(
        False,
        "Read the source as a stream: training starts at once while a background thread "
        "tokenizes documents ahead and packs them window by window, with no token cache "
        "and no total known before the end. Any source with `documents()`; "
        "`hf_datasets` with `streaming: true` is streamed whatever this says. See docs/data.md.",
    )
    window_tokens: int = option(
        1_048_576,
        "Tokens of documents the packer places together (a window; `bfd` fits documents "
        "within one window, `concat` carries what does not fill a row into the next). At "
        "least 2 * data.seq_len.",
        validator=at_least(2),
    )
    ahead: int = option(
        2,
        "Windows tokenized and packed ahead of the training step (the background thread's "
        "bounded queue); memory is about this many windows of rows.",
        validator=at_least(1),
    )


@attrs.frozen
class ChatSection:
    format: Literal["", "messages", "prompt_completion", "preference"] = option(
        "",
        "Read the source's records as chat data ('' reads text): 'messages' (a `messages` "
        "list of {role, content}), 'prompt_completion' (`prompt` and `completion`, each a "
        "string or a messages list) or 'preference' (`prompt` or `messages`, then `chosen` "
        "and `rejected`: one unit of two documents per record). Rendered with the chat "
        "template; see docs/data.md.",
    )
    loss: Literal["assistant", "all"] = option(
        "assistant",
        "Which tokens take a loss: 'assistant' (the assistant turns, the completion) or "
        "'all' (every token of the rendered conversation). Preference pairs always train "
        "on their completions only.",
    )
    template: str = option(
        "",
        "A Jinja chat template file, rendered instead of the tokenizer's own "
        "`chat_template` ('': the tokenizer's). Required with a tokenizer that has none "
        "(byte).",
        validator=path_fits,
    )
    truncation: Literal["drop", "cut_prompt"] = option(
        "drop",
        "What happens to a conversation (or pair) longer than `data.seq_len` with its EOS, "
        "which is never cut silently: 'drop' leaves it out; 'cut_prompt' cuts the tokens "
        "before its first trained token from the left until it fits, and drops it when that "
        "is not enough (pairs are always dropped). The counts are in the data summary.",
    )


@attrs.frozen
class DataSection:
    source: str = option("stdlib", "Registered data source (one source; `sources` for a mixture).")
    source_options: Any = option({}, "The source's own options.")
    sources: list[SourceEntry] = option(
        [],
        "A weighted mixture of sources, instead of `source`/`source_options`: a list of "
        "{name, weight, options, label}.",
    )
    phases: list[PhaseEntry] = option(
        [],
        "Mixture weights that change by step, for a `sources` mixture: a list of "
        "{start_step, weights: {label: weight}, anneal_steps}. Before the first phase "
        "(when it starts after step 0) the sources' own weights hold. See docs/data.md.",
    )
    tokenizer: str = option("byte", "Registered tokenizer.")
    tokenizer_options: Any = option({}, "The tokenizer's own options.")
    packer: str = option("concat", "Registered packer: none, concat, bfd, ...")
    packer_options: Any = option({}, "The packer's own options.")
    seq_len: int = option(256, "Tokens per training row.", validator=at_least(1))
    shuffle: bool = option(True, "Shuffle rows each epoch (seeded by run.seed).")
    num_workers: int = option(
        0, "Loader worker processes (0: load in the training process).", validator=at_least(0)
    )
    heldout: HeldoutSection = option(HeldoutSection(), "A document-level held-out split.")
    cache: CacheSection = option(CacheSection(), "The cache of tokenized sources.")
    chat: ChatSection = option(
        ChatSection(), "Chat and preference data: records rendered by a chat template."
    )
    stream: StreamSection = option(
        StreamSection(), "Streaming: train while the source is tokenized ahead, without the cache."
    )

    def source_entries(self) -> list[tuple[str, SourceEntry]]:
        """``(where, entry)`` for every source the run reads: each of ``sources``
        (``where`` is ``data.sources[i]``), or ``source``/``source_options`` as the one
        entry of weight 1 (``where`` is ``data.source``)."""
        if self.sources:
            return [(f"data.sources[{i}]", entry) for i, entry in enumerate(self.sources)]
        return [("data.source", SourceEntry(name=self.source, weight=1.0, options=self.source_options))]


@attrs.frozen
class ParallelSection:
    """Besides these keys, one degree per mesh dimension a registered strategy declares
    (``parallel.pp``, ``parallel.dp_replicate``, ``parallel.dp_shard``, ``parallel.cp``,
    ``parallel.tp``: :class:`~forge_core.api.MeshDim`); the config loader moves them into
    ``degrees`` and checks them against the declarations, and ``parallel.<dim>`` reads
    them back."""

    wrappers: list[str] = option([], "Extra strategies without a mesh degree, by name.")
    options: dict[str, Any] = option({}, "Per-strategy options, keyed by strategy name.")
    #: Filled by the loader (:meth:`split_raw`), never written: documented from the
    #: declarations (``forge_core.docgen.degree_rows``).
    degrees: dict[str, Any] = attrs.field(factory=dict)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: a degree, read as parallel.<dim>.
        if name.startswith("__") or name == "degrees":
            raise AttributeError(name)
        try:
            return self.degrees[name]
        except KeyError:
            raise AttributeError(f"no parallel degree or key {name!r}") from None

    @staticmethod
    def split_raw(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(section keys, degrees)`` of the unstructured ``parallel`` mapping: every key
        but ``wrappers`` and ``options`` is a degree."""
        own = {k: v for k, v in raw.items() if k in ("wrappers", "options")}
        return own, {k: v for k, v in raw.items() if k not in own}


@attrs.frozen
class NonFiniteSection:
    policy: Literal["skip", "stop"] = option(
        "skip", "On a NaN/inf loss or gradient: skip the step, or stop the run."
    )
    max_consecutive: int = option(3, "Stop after this many consecutive skipped steps.", validator=at_least(1))


@attrs.frozen
class LossSection:
    name: Literal["full", "chunked"] = option(
        "full",
        "'full': the model returns the logits (batch x sequence x vocabulary) and the "
        "cross-entropy is taken over them. 'chunked': the output projection and the "
        "cross-entropy run chunk_tokens tokens at a time, forward and backward, so the full "
        "logits never exist (at a 128k vocabulary and 32k tokens per micro-batch they are "
        "16 GiB in fp32); under tensor parallelism each rank keeps its vocabulary shard of the "
        "head and the log-sum-exp is combined across ranks. Same loss and gradients; the "
        "model must declare its output head (OUTPUT_HEAD in its spec's supports).",
    )
    chunk_tokens: int = option(
        1024,
        "Tokens per chunk for 'chunked': a chunk's fp32 logits take chunk_tokens x "
        "vocabulary x 4 bytes (1024 x 32k: 128 MiB).",
        validator=at_least(1),
    )


@attrs.frozen
class TrainSection:
    steps: int = option(100, "Optimizer steps to train.", validator=at_least(1))
    batch_size: int = option(
        8, "Global batch in rows per optimizer step (all processes).", validator=at_least(1)
    )
    grad_accum: int = option(
        1, "Micro-steps per optimizer step; batch_size must divide by it.", validator=at_least(1)
    )
    lr: float = option(3e-4, "Peak learning rate.", validator=above(0))
    optimizer: str = option("adamw", "Registered optimizer.")
    optimizer_options: Any = option({}, "The optimizer's own options.")
    schedule: str = option("cosine", "Registered learning-rate schedule.")
    schedule_options: Any = option({}, "The schedule's own options.")
    warmup_steps: int = option(
        0, "Linear warmup steps (used by every built-in schedule).", validator=at_least(0)
    )
    schedule_steps: int = option(
        0,
        "Steps the learning-rate schedule spans. 0: the train.steps the run started with, kept "
        "when a resumed run changes train.steps (past its end the learning rate stays at the "
        "schedule's final value). Set it to re-plan the schedule; on resume the log then gives "
        "the learning rate before and after.",
        validator=at_least(0),
    )
    grad_clip: float = option(
        1.0, "Clip the global gradient norm to this (0 disables).", validator=at_least(0)
    )
    precision: Literal["fp32", "bf16"] = option(
        "fp32",
        "fp32, or bf16 autocast: matmuls in bf16, the loss, norms and softmax in "
        "fp32, parameters and optimizer state fp32. Needs a CUDA GPU with bf16 or a CPU with "
        "native bf16 (AVX512_BF16 or AMX); elsewhere the run stops with an error. forge-run "
        "check reads the CPU flags: it refuses bf16 with run.device: cpu on such a CPU, and "
        "warns with run.device: auto when no GPU is visible either.",
    )
    loss: LossSection = option(LossSection(), "The loss: full logits, or chunked.")
    objective: str = option(
        "lm",
        "Registered training objective: 'lm' (next-token cross-entropy, normalized by the labelled "
        "tokens), 'dpo' (preference pairs, normalized by the pairs), ...",
    )
    objective_options: Any = option({}, "The objective's own options.")
    compile: bool = option(False, "torch.compile the model.")
    peak_tflops: float = option(
        0.0,
        "Peak TFLOP/s per process for MFU (dense, in the training dtype). 0: on CUDA the GPU's "
        "datasheet figure (H100, H200, A100, B200), else the best of a few matmuls timed by "
        "CPU time at every start. The log names the source; set it when MFU is capped.",
        validator=at_least(0),
    )
    nonfinite: NonFiniteSection = option(NonFiniteSection(), "What to do on a non-finite loss.")


@attrs.frozen
class CheckpointSection:
    every: int = option(
        0, "Save every N steps (0: only at the end and on SIGTERM/SIGINT).", validator=at_least(0)
    )
    keep: int = option(2, "Complete checkpoints to keep (older ones are deleted).", validator=at_least(1))
    resume: Literal["auto", "never"] = option(
        "auto", "'auto' resumes from the run directory's latest complete checkpoint."
    )
    async_save: bool = option(
        False,
        "Write checkpoints in the background: the save copies the model and optimizer state "
        "in memory (one more copy of it while the save is in flight) and training goes on "
        "while the copy is written; `latest` moves once it is on disk. At most one save is in "
        "flight: the next one waits for it, and so do the save at the end and the one on "
        "SIGTERM/SIGINT before the process exits.",
        key="async",
    )


@attrs.frozen
class EvalSection:
    enabled: bool = option(
        False,
        "Evaluate the held-out loss and perplexity during training (every `every` steps) "
        "and when it completes (`at_end`). `forge-run eval` evaluates any run, whatever this says.",
    )
    every: int = option(
        0,
        "Evaluate every N optimizer steps, counted from the start of the run, so the cadence "
        "is the same after a resume (0: only at the end). Only with `enabled: true`: setting it "
        "does not switch evaluation on, and `forge-run check` warns when it is set without.",
        validator=at_least(0),
    )
    at_end: bool = option(
        True, "Also evaluate when training completes (once, if the cadence already evaluated the last step)."
    )
    source: str = option(
        "",
        "What to evaluate on: '' is the held-out split of the training data "
        "(data.heldout, every source of the run); a registered source name evaluates all of "
        "that source's documents instead.",
    )
    source_options: Any = option({}, "The eval source's own options (with `source` set).")
    batch_size: int = option(
        0,
        "Rows per evaluation batch over all processes (0: the training micro-batch, "
        "train.batch_size / train.grad_accum). Must split evenly over data-parallel ranks.",
        validator=at_least(0),
    )
    max_batches: int = option(0, "Evaluate at most this many batches (0: no limit).", validator=at_least(0))
    max_tokens: int = option(
        0,
        "Evaluate at most this many tokens, counted as rows x data.seq_len and rounded up "
        "to whole rows (0: no limit). With max_batches, the tighter limit applies.",
        validator=at_least(0),
    )

    def batch_rows(self, train: TrainSection) -> int:
        """Rows per evaluation batch over all processes (``batch_size``, or the training
        micro-batch)."""
        return self.batch_size or max(1, train.batch_size // train.grad_accum)

    def due(self, step: int, total_steps: int) -> bool:
        """Whether the run evaluates after optimizer step ``step`` (1-based) of
        ``total_steps``: every ``every`` steps from the start of the run, and the last with
        ``at_end``."""
        if not self.enabled:
            return False
        return bool(self.every and step % self.every == 0) or (self.at_end and step == total_steps)


@attrs.frozen
class LoggingSection:
    loggers: list[str] = option(["console", "jsonl"], "Registered loggers to enable.")
    every: int = option(1, "Log every N steps.", validator=at_least(1))
    options: dict[str, Any] = option({}, "Per-logger options, keyed by logger name.")


@attrs.frozen
class PluginsSection:
    block: list[str] = option([], "Plugins not to load (names from `forge-run plugins`).")
    prefer: dict[str, dict[str, str]] = option(
        {},
        "Whose component a name means when several plugins register it, by kind and name: "
        "`{schedule: {wsd: my_plugin}}`. A config can use such a name only once it is chosen "
        "here; `forge-run check` warns that the chosen one shadows the others.",
    )


@attrs.frozen
class ForgeConfig:
    run: RunSection = option(RunSection(), "Run identity and placement.")
    model: ModelSection = option(ModelSection(), "The model.")
    attention: AttentionSection = option(AttentionSection(), "The attention backend.")
    data: DataSection = option(DataSection(), "Source, tokenizer, packer, loader.")
    parallel: ParallelSection = option(ParallelSection(), "Device mesh and strategies.")
    train: TrainSection = option(TrainSection(), "Optimization.")
    checkpoint: CheckpointSection = option(CheckpointSection(), "Checkpointing and resume.")
    eval: EvalSection = option(EvalSection(), "Held-out evaluation (loss and perplexity).")
    logging: LoggingSection = option(LoggingSection(), "Loggers.")
    plugins: PluginsSection = option(PluginsSection(), "Plugin loading.")


#: Every single component choice in the config (one name, one option block): the kinds
#: of :data:`~forge_core.kinds.KINDS` that are not keyed.
OPTION_BLOCKS: tuple[Kind, ...] = tuple(k for k in KINDS if not k.keyed)

#: Option maps keyed by component name (``parallel.options.<name>``), beside the list
#: that enables components by name (strategies with a mesh dimension are enabled by
#: their degree instead).
KEYED_BLOCKS: tuple[Kind, ...] = tuple(k for k in KINDS if k.keyed)


for _cls in (
    RunSection,
    ModelSection,
    AttentionSection,
    SourceEntry,
    HeldoutSection,
    CacheSection,
    DataSection,
    ParallelSection,
    NonFiniteSection,
    LossSection,
    TrainSection,
    CheckpointSection,
    EvalSection,
    LoggingSection,
    PluginsSection,
    ForgeConfig,
):
    attrs.resolve_types(_cls)  # real types on fields, for docs generation and tests
