"""Other trainers' settings under their Forge names: one table, read in three places.

``docs/coming-from.md`` shows the tables (:mod:`forge_core.docgen` writes them from
:data:`TRAINERS`); a config key Forge does not know but another trainer does gets its
row in the unknown-key error (:func:`unknown_key_hint`); and a flag such as
``--max_steps 100``, which Forge does not take, is answered with the override to write
instead (:func:`flag_hint`). Each cell is Markdown as the page shows it; errors show it
without the backticks.

The keys a row answers for are read from its first cell, in the other trainer's own
spelling: ``max_steps`` and ``bf16=True`` (a key, a value) are keys at the top of a
config, ``train.max_steps`` is a key ``max_steps`` in a section ``train``, ``[training]
steps`` (a TOML table) is ``training.steps``, and ``--training.steps 100`` is the flag of
that key.

A row whose value does not carry over as it is says how it translates (``translate``):
TRL's ``--lora_target_modules q_proj,v_proj`` is written ``model.transform_options.lora.
targets=[attention.q,attention.v]``; where no value can be computed from theirs alone
(epochs, a per-device batch) the override shows a placeholder and the note says how.
"""

from __future__ import annotations

import functools
import re
import shlex
import typing
from collections.abc import Callable

import attrs

from forge_core.config.schema import ForgeConfig


def settings(cell: str) -> list[tuple[str, str | None]]:
    """The ``(dotted key, value or None)`` of each setting a cell names in code spans:
    ``max_steps``, ``bf16=True``, ``precision: bf16-mixed``, ``[training] steps, seq_len``,
    ``--training.steps 100``; a span that is not a setting (``forge-run --nproc 8``) is none."""
    found: list[tuple[str, str | None]] = []
    for span in re.findall(r"`([^`]+)`", cell):
        if span.startswith("--"):
            key, _, value = span[2:].partition(" ")
            found.append((key, value or None))
            continue
        table = re.fullmatch(r"\[([\w.]+)\]\s+(.*)", span)
        prefix, names = (table.group(1) + ".", table.group(2).split(",")) if table else ("", [span])
        for name in names:
            setting = re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*(?:(?:=|:)\s*(.+?))?\s*", name)
            if setting:
                value = setting.group(2)
                found.append((prefix + setting.group(1), value.strip("\"'") if value else None))
    return found


def _computed(value: str) -> str | None:
    """A value that does not carry over: computed from more than the other trainer's."""
    return None


@attrs.frozen
class Row:
    """One row of a trainer's table: the other trainer's setting, Forge's, and a note;
    ``translate`` turns their value into Forge's (``None`` from it: not from theirs alone)."""

    theirs: str
    forge: str
    note: str = ""
    translate: Callable[[str], str | None] | None = attrs.field(default=None, eq=False)

    @property
    def keys(self) -> tuple[str, ...]:
        """The dotted config keys of the first cell (module docstring)."""
        return tuple(key for key, _ in settings(self.theirs))


@attrs.frozen
class Trainer:
    """One other trainer: its name in a sentence, its table's first column heading, its rows."""

    name: str
    column: str
    rows: tuple[Row, ...]

    def table(self) -> str:
        """The Markdown table of ``docs/coming-from.md``."""
        lines = [f"| {self.column} | Forge | note |", "| --- | --- | --- |"]
        lines += [
            "|" + "|".join(f" {c} " if c else " " for c in (row.theirs, row.forge, row.note)) + "|"
            for row in self.rows
        ]
        return "\n".join(lines)


# The Hugging Face Trainer's rows that TRL's configs (TrainingArguments underneath) share.
EPOCHS = Row("`num_train_epochs`", "`train.steps`", "steps = epochs x rows / `train.batch_size`", _computed)
PER_DEVICE = Row(
    "`per_device_train_batch_size`",
    "`train.batch_size`",
    "Forge's is global: per-device x processes x accumulation, e.g. 8 x 4 processes x 2 = 64",
    _computed,
)
ACCUMULATION = Row(
    "`gradient_accumulation_steps`", "`train.grad_accum`", "the global batch already includes it"
)
LEARNING_RATE = Row("`learning_rate`", "`train.lr`")


HF = Trainer(
    "the Hugging Face Trainer",
    "Trainer",
    (
        Row("`max_steps`", "`train.steps`"),
        EPOCHS,
        PER_DEVICE,
        ACCUMULATION,
        LEARNING_RATE,
        Row("`warmup_steps`", "`train.warmup_steps`"),
        Row("`warmup_ratio`", "`train.warmup_steps`", "give the steps: ratio x `train.steps`"),
        Row(
            '`lr_scheduler_type="cosine"`',
            "`train.schedule: cosine`",
            "the Trainer decays to 0: set `train.schedule_options.min_lr_ratio: 0`",
        ),
        Row('`lr_scheduler_type="linear"`', "`train.schedule: linear`"),
        Row('`lr_scheduler_type="constant_with_warmup"`', "`train.schedule: constant`"),
        Row(
            "`weight_decay`",
            "`train.optimizer_options.weight_decay`",
            "Forge's AdamW default is 0.1, the Trainer's 0",
        ),
        Row(
            "`adam_beta1`, `adam_beta2`, `adam_epsilon`",
            "`train.optimizer_options.beta1`, `train.optimizer_options.beta2`, `train.optimizer_options.eps`",
            "Forge's beta2 default is 0.95, the Trainer's 0.999",
        ),
        Row(
            '`optim="adamw_torch_fused"`',
            "`train.optimizer_options.implementation: fused`",
            "`auto` picks fused on CUDA already",
        ),
        Row('`optim="sgd"`', "`train.optimizer: sgd`"),
        Row("`max_grad_norm`", "`train.grad_clip`", "1.0 in both; 0 disables"),
        Row("`bf16=True`", "`train.precision: bf16`", "autocast; fp16 is not offered"),
        Row("`torch_compile=True`", "`train.compile: true`"),
        Row("`save_steps`", "`checkpoint.every`", "0 saves only at the end and on SIGTERM/SIGINT"),
        Row(
            '`eval_strategy="steps"`, `eval_steps`',
            "`eval.enabled: true`, `eval.every`",
            "streaming: no logits kept, see [evaluation](evaluation.md)",
        ),
        Row("`per_device_eval_batch_size`", "`eval.batch_size`", "global, like `train.batch_size`"),
        Row(
            "`gradient_checkpointing=True`",
            "`parallel.wrappers: [act_ckpt]`",
            "every block; `parallel.options.act_ckpt.every` for every k-th",
        ),
        Row("`save_total_limit`", "`checkpoint.keep`"),
        Row(
            "`resume_from_checkpoint`",
            "`checkpoint.resume: auto`",
            "the default: the latest complete checkpoint of `run.out_dir`",
        ),
        Row("`output_dir`", "`run.out_dir`"),
        Row("`seed`", "`run.seed`", "seeds model init, data order and dropout"),
        Row("`logging_steps`", "`logging.every`"),
        Row(
            '`report_to=["wandb"]`',
            "`logging.loggers: [console, jsonl, wandb]`",
            "also `tensorboard`, `mlflow`",
        ),
        Row("`dataloader_num_workers`", "`data.num_workers`"),
        Row(
            "`DataCollatorWithFlattening` (packing)",
            "`data.packer: bfd`",
            "packing with document isolation, see [data](data.md)",
        ),
    ),
)


TORCHTITAN = Trainer(
    "torchtitan",
    "torchtitan",
    (
        Row("`[training] steps`", "`train.steps`"),
        Row(
            "`[training] local_batch_size`",
            "`train.batch_size`",
            "Forge's is global; torchtitan's `global_batch_size` is the same as Forge's",
        ),
        Row("`[training] seq_len`", "`data.seq_len`"),
        Row("`[training] max_norm`", "`train.grad_clip`"),
        Row('`[training] mixed_precision_param = "bfloat16"`', "`train.precision: bf16`"),
        Row(
            "`[optimizer] name, lr, eps, weight_decay`",
            "`train.optimizer: adamw`, `train.lr`, `train.optimizer_options.eps`, "
            "`train.optimizer_options.weight_decay`",
        ),
        Row("`[lr_scheduler] warmup_steps`", "`train.warmup_steps`"),
        Row(
            "`[lr_scheduler] decay_ratio, decay_type, min_lr_factor`",
            "`train.schedule: wsd`, `train.schedule_options.decay_fraction`, "
            "`train.schedule_options.decay_shape`, `train.schedule_options.min_lr_ratio`",
            "the same warmup-stable-decay shape",
        ),
        Row(
            "`[parallelism] data_parallel_shard_degree`",
            "`parallel.dp_shard`",
            "-1 means the same: what the other degrees leave",
        ),
        Row(
            "`[parallelism] data_parallel_replicate_degree`",
            "`parallel.dp_replicate`",
            "HSDP when both are above 1",
        ),
        Row(
            "`[parallelism] tensor_parallel_degree`",
            "`parallel.tp`",
            "`parallel.options.tp.sequence_parallel` too",
        ),
        Row("`[parallelism] pipeline_parallel_degree`", "`parallel.pp`"),
        Row(
            "`[parallelism] pipeline_parallel_schedule`",
            "`parallel.options.pp.schedule`",
            "also `looped_bfs`, `interleaved_zero_bubble`, `zbv_zero_bubble`, `dualpipev`, "
            "all with packed documents",
        ),
        Row(
            '`[activation_checkpoint] mode = "full"`',
            "`parallel.wrappers: [act_ckpt]`",
            "`selective` per layer: `parallel.options.act_ckpt.every`",
        ),
        Row(
            "`[validation] enable, freq, steps`", "`eval.enabled: true`, `eval.every`, `eval.max_batches`", ""
        ),
        Row("`[checkpoint] interval`", "`checkpoint.every`"),
        Row("`[checkpoint] keep_latest_k`", "`checkpoint.keep`"),
        Row('`[checkpoint] async_mode = "async"`', "`checkpoint.async: true`"),
        Row("`[compile] enable`", "`train.compile: true`"),
        Row("`[metrics] log_freq`", "`logging.every`"),
        Row("`[metrics] enable_tensorboard`", "`logging.loggers: [console, jsonl, tensorboard]`"),
        Row("`[job] dump_folder`", "`run.out_dir`"),
        Row("`--training.steps 100`", "`train.steps=100`", "overrides are `key=value`"),
    ),
)


LITGPT = Trainer(
    "LitGPT",
    "LitGPT",
    (
        Row(
            "`train.max_steps`",
            "`train.steps`",
            "for a token budget (`max_tokens`), divide it by `train.batch_size` x `data.seq_len`",
        ),
        Row("`train.global_batch_size`", "`train.batch_size`", "the same meaning: global"),
        Row(
            "`train.micro_batch_size`",
            "`train.grad_accum`",
            "Forge derives the micro-batch from the global batch and the accumulation",
        ),
        Row("`train.max_seq_length`", "`data.seq_len`"),
        Row("`train.lr_warmup_steps`", "`train.warmup_steps`"),
        Row("`train.min_lr`", "`train.schedule_options.min_lr_ratio`", "a ratio of `train.lr`, not a rate"),
        Row("`train.max_norm`", "`train.grad_clip`"),
        Row("`train.save_interval`", "`checkpoint.every`"),
        Row("`train.log_interval`", "`logging.every`"),
        Row("`optimizer.init_args.lr`", "`train.lr`"),
        Row("`optimizer.init_args.weight_decay`", "`train.optimizer_options.weight_decay`"),
        Row("`precision: bf16-mixed`", "`train.precision: bf16`"),
        Row("`devices: 8`", "`forge-run --nproc 8`", "`num_nodes`: `forge-run --nnodes`"),
        Row("`out_dir`", "`run.out_dir`"),
        Row("`seed`", "`run.seed`"),
        Row("`resume: auto`", "`checkpoint.resume: auto`", "the same word, and Forge's default"),
        Row("`logger_name: tensorboard`", "`logging.loggers: [console, jsonl, tensorboard]`"),
        Row("`tokenizer_dir`", "`data.tokenizer: hf`, `data.tokenizer_options.path`", "a local folder"),
        Row("`model_name`, `model_config`", "`model.name`, `model.options`"),
    ),
)


AXOLOTL = Trainer(
    "axolotl",
    "axolotl",
    (
        Row("`max_steps`", "`train.steps`", "`num_epochs`: compute the steps"),
        Row(
            "`micro_batch_size`",
            "`train.batch_size`",
            "Forge's is global: micro x processes x accumulation, e.g. 2 x 8 processes x 4 = 64",
        ),
        Row("`gradient_accumulation_steps`", "`train.grad_accum`"),
        Row("`sequence_len`", "`data.seq_len`"),
        Row(
            "`sample_packing: true`",
            "`data.packer: bfd`",
            "documents isolated by `doc_ids`, as multipack does",
        ),
        Row("`learning_rate`", "`train.lr`"),
        Row("`lr_scheduler: cosine`", "`train.schedule: cosine`"),
        Row("`cosine_min_lr_ratio`", "`train.schedule_options.min_lr_ratio`"),
        Row("`warmup_steps`", "`train.warmup_steps`", "`warmup_ratio`: give the steps"),
        Row("`optimizer: adamw_torch`", "`train.optimizer: adamw`"),
        Row("`weight_decay`", "`train.optimizer_options.weight_decay`"),
        Row("`max_grad_norm`", "`train.grad_clip`"),
        Row("`bf16: true`", "`train.precision: bf16`"),
        Row("`torch_compile: true`", "`train.compile: true`"),
        Row("`save_steps`", "`checkpoint.every`"),
        Row("`save_total_limit`", "`checkpoint.keep`"),
        Row("`auto_resume_from_checkpoints`", "`checkpoint.resume: auto`"),
        Row("`output_dir`", "`run.out_dir`"),
        Row("`seed`", "`run.seed`"),
        Row("`logging_steps`", "`logging.every`"),
        Row(
            "`wandb_project`",
            "`logging.loggers: [console, jsonl, wandb]`, `logging.options.wandb.project`",
        ),
        Row(
            "`datasets` (local files)",
            "`data.source: text`, `data.source_options.paths`",
            "or `hf_datasets` for a saved data set",
        ),
        Row("`dataset_prepared_path`", "`data.cache.dir`", "tokenized once, reused by every run"),
        Row(
            "`val_set_size`",
            "`data.heldout.fraction`",
            "held out by a hash of each document; `eval.enabled: true` evaluates on it",
        ),
        Row("`eval_steps`", "`eval.every`"),
        Row("`gradient_checkpointing: true`", "`parallel.wrappers: [act_ckpt]`"),
        Row(
            "`optimizer: muon`", "`train.optimizer: muon`", "Muon on the blocks' matrices, AdamW on the rest"
        ),
        Row(
            "`base_model`",
            "`model.options.init_from_hf`",
            "a Hub id or a local folder; Llama, Qwen2, Qwen3, Mistral, OLMo 2, Qwen3-MoE and Mixtral "
            "checkpoints; shapes read from `config.json`",
        ),
        Row("`fsdp`, `deepspeed`", "`parallel.dp_shard`", "FSDP2; there is no DeepSpeed"),
    ),
)


#: What a module name means as a role of the model's contract (LoRA's targets).
ROLES = {
    "q_proj": "attention.q",
    "k_proj": "attention.k",
    "v_proj": "attention.v",
    "o_proj": "attention.o",
    "gate_proj": "mlp.gate",
    "up_proj": "mlp.up",
    "down_proj": "mlp.down",
}


def roles(value: str) -> str | None:
    """PEFT's ``target_modules`` (``q_proj,v_proj``, ``[q_proj, v_proj]``, ``all-linear``)
    as LoRA's ``targets``; ``None`` when a name is not one of :data:`ROLES`."""
    names = [n for n in re.split(r"[\s,\[\]'\"]+", value) if n]
    if names == ["all-linear"]:
        names = list(ROLES)
    if not names or any(n not in ROLES for n in names):
        return None
    return "[" + ",".join(dict.fromkeys(ROLES[n] for n in names)) + "]"


_TARGETS_NOTE = (
    "roles, not module names: `q_proj`, `k_proj`, `v_proj`, `o_proj` are `attention.q` ... `attention.o`, "
    "`gate_proj`, `up_proj`, `down_proj` are `mlp.gate`, `mlp.up`, `mlp.down`; `all-linear` is all seven"
)

TRL = Trainer(
    "TRL",
    "TRL",
    (
        Row(
            "`assistant_only_loss=True`",
            "`data.chat.loss: assistant`",
            "Forge's default with `data.chat.format: messages`; TRL's default trains every token",
        ),
        Row("`assistant_only_loss=False`", "`data.chat.loss: all`"),
        Row(
            "`completion_only_loss=True`",
            "`data.chat.format: prompt_completion`",
            "the completion alone takes a loss, as in TRL",
        ),
        Row("`completion_only_loss=False`", "`data.chat.loss: all`", "the prompt takes a loss too"),
        Row(
            "`dataset_text_field`",
            "`data.source_options.text_field`",
            "text records; chat records are read by `data.chat.format` instead",
        ),
        Row("`chat_template_path`", "`data.chat.template`", "a Jinja file; '' is the tokenizer's own"),
        Row(
            "`max_length`",
            "`data.seq_len`",
            "a row's tokens; a conversation (a DPO pair: prompt twice, both answers) longer than a row is "
            "dropped or its prompt cut (`data.chat.truncation`), never its answer",
        ),
        Row("`max_seq_length`", "`data.seq_len`", "TRL's older name of `max_length`"),
        Row(
            "`max_prompt_length`",
            "`data.chat.truncation: cut_prompt`",
            "no prompt budget: a prompt is cut from the left only as far as the row needs",
        ),
        Row(
            "`packing=True`",
            "`data.packer: bfd`",
            "whole conversations, isolated by `doc_ids`, as TRL's `bfd` with `padding_free`",
        ),
        Row("`packing=False`", "`data.packer: none`", "one conversation per row, padded"),
        Row("`padding_free=True`", "`data.packer: bfd`"),
        Row("`beta`", "`train.objective_options.beta`", "with `train.objective: dpo`; 0.1 in both"),
        Row('`loss_type="sigmoid"`', "`train.objective: dpo`, `train.objective_options.loss: sigmoid`"),
        Row('`loss_type="ipo"`', "`train.objective: dpo`, `train.objective_options.loss: ipo`"),
        Row("`reference_free=True`", "`train.objective: dpo`, `train.objective_options.reference: none`"),
        Row(
            "`use_peft=True`",
            "`model.transforms: [lora]`",
            "with DPO the reference is the model with its adapters off: no copy",
        ),
        Row("`lora_r`", "`model.transform_options.lora.rank`", "PEFT's `r`"),
        Row("`r`", "`model.transform_options.lora.rank`", "PEFT's `LoraConfig`"),
        Row("`lora_alpha`", "`model.transform_options.lora.alpha`", "scale alpha / rank in both"),
        Row("`lora_dropout`", "`model.transform_options.lora.dropout`"),
        Row("`lora_target_modules`", "`model.transform_options.lora.targets`", _TARGETS_NOTE, roles),
        Row("`target_modules`", "`model.transform_options.lora.targets`", _TARGETS_NOTE, roles),
        Row("`model_name_or_path`", "`model.options.init_from_hf`", "a Hub id or a local folder"),
        LEARNING_RATE,
        EPOCHS,
        PER_DEVICE,
        ACCUMULATION,
    ),
)


#: Every trainer, by the name of its table's placeholder on the page (``{{table:hf}}``).
TRAINERS: dict[str, Trainer] = {
    "hf": HF,
    "torchtitan": TORCHTITAN,
    "litgpt": LITGPT,
    "axolotl": AXOLOTL,
    "trl": TRL,
}


def plain(markdown: str) -> str:
    """A cell as an error shows it: no backticks, a link as its text and page."""
    text = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r"\1 (docs/\2)", markdown)
    return text.replace("`", "")


def _rows_for(path: str) -> list[tuple[Trainer, Row]]:
    """The rows that answer for ``path``: at the top of a config, its own key and the rows
    of the section it names (torchtitan's ``[training]``); inside a section, its own key,
    else a key of the top of another trainer's config put there (``train.learning_rate``).
    A row that shows a flag (torchtitan's ``--training.steps 100``) only illustrates one."""
    every = [(t, row) for t in TRAINERS.values() for row in t.rows if not row.theirs.startswith("`--")]
    if "." not in path:  # a key, or a section, of another trainer's config (or both: optimizer)
        return [(t, row) for t, row in every if any(k == path or k.startswith(path + ".") for k in row.keys)]
    leaf = path.rpartition(".")[2]
    return [(t, row) for t, row in every if path in row.keys] or [
        (t, row) for t, row in every if leaf in row.keys
    ]


def _owners(names: list[str]) -> str:
    """``A's``, ``A's and B's``, ``A's, B's and C's``."""
    owned = [f"{name}'s" for name in names]
    return owned[0] if len(owned) == 1 else f"{', '.join(owned[:-1])} and {owned[-1]}"


def foreign_hint(path: str) -> str:
    """What other trainers mean by the config key ``path`` and Forge's name for it, as
    sentences, or ``""`` when no trainer's table has it."""
    said: dict[str, list[str]] = {}  # one sentence for the trainers that say the same
    for trainer, row in _rows_for(path):
        verb = "is" if len(row.keys) == 1 else "are"
        sentence = f"{plain(row.theirs)} {verb} Forge's {plain(row.forge)}"
        if row.note:
            sentence += f" ({plain(row.note)})"
        said.setdefault(sentence, []).append(trainer.name)
    parts = [f"{_owners(names)} {sentence}" for sentence, names in said.items()]
    text = "; ".join(parts)
    if text.startswith("the "):
        text = "T" + text[1:]  # "the Hugging Face Trainer" opens the sentence; torchtitan stays lower case
    return f"{text}." if text else ""


@functools.cache
def _section_paths() -> dict[type, str]:
    """Each attrs class of the schema by the dotted path of its section ('' for the root)."""
    paths: dict[type, str] = {}

    def walk(cls: type, prefix: str) -> None:
        paths.setdefault(cls, prefix)
        for field in attrs.fields(cls):
            tp = field.type
            args = typing.get_args(tp)
            inner = args[0] if typing.get_origin(tp) is list and args else tp
            if isinstance(inner, type) and attrs.has(inner):
                walk(inner, f"{prefix}.{field.name}".lstrip("."))

    walk(ForgeConfig, "")
    return paths


def unknown_key_hint(section_class: type, key: str) -> str:
    """For an unknown ``key`` of the schema class ``section_class``: what other trainers
    mean by it, with a leading space, or ``""`` (also for a class outside the schema: a
    component's options)."""
    section = _section_paths().get(section_class)
    hint = "" if section is None else foreign_hint(f"{section}.{key}".lstrip("."))
    return f" {hint}" if hint else ""


def _value(row: Row, key: str, value: str | None) -> str:
    """Forge's value of ``key`` for the other trainer's ``value``: the same, translated, or
    a placeholder named after the key (``STEPS``) where it is computed from more."""
    if value is None:
        return "VALUE"
    if row.translate is None:
        return value
    return row.translate(value) or key.rpartition(".")[2].upper()


def flag_hint(flag: str, value: str | None) -> str | None:
    """For ``--flag [value]``, which Forge does not take: the ``key=value`` override to
    write instead, where ``flag`` is another trainer's setting or a Forge key; ``None``
    for a flag that is neither."""
    path = flag.lstrip("-").replace("-", "_")
    overrides: dict[str, None] = {}
    for _, row in _rows_for(path):
        theirs, forge = settings(row.theirs), settings(row.forge)
        index = next((i for i, (key, _) in enumerate(theirs) if key == path), None)
        if index is None:
            continue  # a row of the section the flag names
        their_value = theirs[index][1]
        wanted = value
        if wanted is None and their_value is not None and their_value.lower() in ("true", "false"):
            wanted = "true"  # a bare boolean flag is true, as HfArgumentParser reads it
        if their_value is not None and wanted is not None and their_value.lower() != wanted.lower():
            continue  # another value's row (lr_scheduler_type="linear" for --lr_scheduler_type cosine)
        if len(forge) == len(theirs):
            forge = [forge[index]]  # the settings correspond one to one
        elif len(theirs) > 1:
            continue  # no one Forge setting to name; the hint says what there is
        write = [shlex.quote(f"{key}={_value(row, key, value) if v is None else v}") for key, v in forge]
        if write:
            overrides[" ".join(write)] = None
    if not overrides and path.split(".")[0] in {field.name for field in attrs.fields(ForgeConfig)}:
        overrides[shlex.quote(f"{path}={'VALUE' if value is None else value}")] = (
            None  # a Forge key as a flag
        )
    hint = foreign_hint(path)
    if not (overrides or hint):
        return None
    write = f": write {' or '.join(overrides)}" if overrides else ""
    return f"Forge takes settings as key=value overrides, not flags{write}. {hint}".rstrip()
