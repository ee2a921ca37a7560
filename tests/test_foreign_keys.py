"""Keys and flags brought from another trainer are answered from one table
(:mod:`forge_core.config.foreign_keys`): the unknown-key error quotes the row, a flag
gets the override to write, and ``docs/coming-from.md`` shows exactly those tables."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
from conftest import write_config

from forge_core import docgen
from forge_core.config.foreign_keys import TRAINERS, foreign_hint, plain, settings, unknown_key_hint
from forge_core.config.loader import ConfigError, load_config

PAGE = Path(__file__).resolve().parent.parent / "docs" / "coming-from.md"


def config_issues(tmp_path, data: dict) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / "c.yaml", data))
    return dict(caught.value.issues)


@pytest.mark.parametrize(
    ("data", "path", "said"),
    [
        (
            {"per_device_train_batch_size": 8},
            "$",
            "The Hugging Face Trainer's and TRL's per_device_train_batch_size is Forge's train.batch_size "
            "(Forge's is global: per-device x processes x accumulation, e.g. 8 x 4 processes x 2 = 64)",
        ),
        (
            {"num_train_epochs": 3},
            "$",
            "The Hugging Face Trainer's and TRL's num_train_epochs is Forge's train.steps",
        ),
        (
            {"gradient_accumulation_steps": 4},
            "$",
            "The Hugging Face Trainer's and TRL's gradient_accumulation_steps is Forge's train.grad_accum "
            "(the global",
        ),
        ({"save_steps": 500}, "$", "save_steps is Forge's checkpoint.every"),
        (
            {"learning_rate": 3e-4},
            "$",
            "The Hugging Face Trainer's, axolotl's and TRL's learning_rate is Forge's train.lr",
        ),
        # An HF key put inside a Forge section is still recognised.
        ({"train": {"learning_rate": 3e-4}}, "$.train", "learning_rate is Forge's train.lr"),
        (
            {"training": {"local_batch_size": 8}},
            "$",
            "torchtitan's [training] local_batch_size is Forge's train.batch_size",
        ),
        (
            {"parallelism": {"tensor_parallel_degree": 2}},
            "$",
            "tensor_parallel_degree is Forge's parallel.tp",
        ),
        (
            {"checkpoint": {"interval": 100}},
            "$.checkpoint",
            "torchtitan's [checkpoint] interval is Forge's checkpoint.every",
        ),
        ({"train": {"max_steps": 100}}, "$.train", "LitGPT's train.max_steps is Forge's train.steps"),
        ({"precision": "bf16-mixed"}, "$", "LitGPT's precision: bf16-mixed is Forge's train.precision: bf16"),
        (
            {"micro_batch_size": 2},
            "$",
            "axolotl's micro_batch_size is Forge's train.batch_size (Forge's is global",
        ),
        ({"sequence_len": 512}, "$", "axolotl's sequence_len is Forge's data.seq_len"),
        # TRL's SFTConfig, DPOConfig and ModelConfig, and PEFT's LoraConfig.
        (
            {"assistant_only_loss": True},
            "$",
            "TRL's assistant_only_loss=True is Forge's data.chat.loss: assistant",
        ),
        ({"max_length": 1024}, "$", "TRL's max_length is Forge's data.seq_len"),
        ({"lora_r": 16}, "$", "TRL's lora_r is Forge's model.transform_options.lora.rank"),
        (
            {"model": {"lora_alpha": 32}},
            "$.model",
            "TRL's lora_alpha is Forge's model.transform_options.lora.alpha",
        ),
        ({"train": {"beta": 0.1}}, "$.train", "TRL's beta is Forge's train.objective_options.beta"),
        ({"packing": True}, "$", "TRL's packing=True is Forge's data.packer: bfd"),
        (
            {"lora_target_modules": ["q_proj"]},
            "$",
            "TRL's lora_target_modules is Forge's model.transform_options.lora.targets (roles, not module",
        ),
        (
            {"dataset_text_field": "body"},
            "$",
            "TRL's dataset_text_field is Forge's data.source_options.text_field",
        ),
    ],
)
def test_an_unknown_key_from_another_trainer_gets_its_row(tmp_path, data, path, said):
    message = config_issues(tmp_path, data)[path]
    assert message.startswith("unknown key ") and said in message and "(keys here: " in message


def test_did_you_mean_still_comes_with_the_row(tmp_path):
    issues = config_issues(tmp_path, {"train": {"lr_warmup_steps": 10}, "training": {"steps": 5}})
    assert (
        "Did you mean 'warmup_steps'? LitGPT's train.lr_warmup_steps is Forge's train.warmup_steps."
        in (issues["$.train"])
    )
    assert "Did you mean 'train'? torchtitan's [training] steps is Forge's train.steps" in issues["$"]
    # A plain misspelling of a Forge key: the did-you-mean alone, no other trainer's row.
    message = config_issues(tmp_path, {"train": {"stpes": 5}})["$.train"]
    assert "Did you mean 'steps'?" in message and "Forge's" not in message


def test_a_components_options_get_no_other_trainers_rows():
    @attrs.frozen
    class Options:
        dim: int = 8

    assert unknown_key_hint(Options, "learning_rate") == ""


def test_every_row_answers_for_the_keys_of_its_first_cell_and_none_is_a_forge_key():
    forge_keys = set(docgen.config_keys())
    for trainer in TRAINERS.values():
        for row in trainer.rows:
            assert row.keys, f"{trainer.column}: {row.theirs} names no key"
            assert not set(row.keys) & forge_keys, f"{row.theirs} is a Forge key: no error would quote it"
            if not row.theirs.startswith("`--"):
                assert all(plain(row.theirs) in foreign_hint(key) for key in row.keys), row.theirs


def test_the_first_cells_spellings_are_read_as_keys():
    assert settings('`lr_scheduler_type="cosine"`') == [("lr_scheduler_type", "cosine")]
    assert settings("`[optimizer] name, lr`") == [("optimizer.name", None), ("optimizer.lr", None)]
    assert settings('`[training] mixed_precision_param = "bfloat16"`') == [
        ("training.mixed_precision_param", "bfloat16")
    ]
    assert settings("`precision: bf16-mixed`, `devices: 8`") == [
        ("precision", "bf16-mixed"),
        ("devices", "8"),
    ]
    assert settings("`--training.steps 100`") == [("training.steps", "100")]
    assert settings("`forge-run --nproc 8`") == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--max_steps", "100"],
            "--max_steps: Forge takes settings as key=value overrides, not flags: "
            "write train.steps=100. The Hugging Face Trainer's max_steps is Forge's train.steps",
        ),
        (["--learning_rate", "3e-4"], "write train.lr=3e-4."),
        (["--learning_rate=3e-4"], "write train.lr=3e-4."),
        (["--max-steps", "7"], "write train.steps=7."),
        (["--lr_scheduler_type", "linear"], "write train.schedule=linear."),
        (["--bf16"], "write train.precision=bf16."),
        (["--training.steps", "5"], "write train.steps=5."),
        (["--train.max_steps", "5"], "write train.steps=5. LitGPT's train.max_steps"),
        (["--adam_beta2", "0.99"], "write train.optimizer_options.beta2=0.99."),
        (["--train.steps", "5"], "write train.steps=5."),  # a Forge key written as a flag
        # TRL's flags: a bare boolean is true; a value whose meaning differs is translated,
        # or left to compute where it cannot be from theirs alone.
        (["--assistant_only_loss"], "write data.chat.loss=assistant."),
        (["--assistant_only_loss", "False"], "write data.chat.loss=all."),
        (["--lora_r", "16"], "write model.transform_options.lora.rank=16."),
        (
            ["--lora_target_modules", "q_proj,v_proj"],
            "write 'model.transform_options.lora.targets=[attention.q,attention.v]'.",
        ),
        (["--loss_type", "ipo"], "write train.objective=dpo train.objective_options.loss=ipo."),
        (["--num_train_epochs", "3"], "write train.steps=STEPS. The Hugging Face Trainer's and TRL's"),
        (["--per_device_train_batch_size", "8"], "write train.batch_size=BATCH_SIZE."),
        (["--nprocs", "2"], "--nprocs is not an option. Did you mean '--nproc'? Options: --help, --nproc"),
    ],
)
def test_a_flag_forge_does_not_take_gets_the_override_to_write(tmp_path, forge_run, argv, said):
    config = write_config(tmp_path / "c.yaml", {})
    result = forge_run([config, *argv])
    assert result.code == 2 and "unrecognized arguments" in result.stderr and said in result.stderr
    assert "Traceback" not in result.stderr


def test_check_also_answers_a_flag(tmp_path, forge_run):
    config = write_config(tmp_path / "c.yaml", {})
    result = forge_run(["check", config, "--max_steps", "100"])
    assert result.code == 2 and "write train.steps=100" in result.stderr
    assert forge_run(["check", config, "train.steps=100"]).code == 0
    # A command without overrides gets no override to write.
    result = forge_run(["sample", str(tmp_path), "--max_steps", "100"])
    assert result.code == 2 and "--max_steps is not an option. Options: --help, --prompt" in result.stderr


def _tables(markdown: str) -> list[str]:
    return [block for block in re.split(r"\n\s*\n", markdown) if block.startswith("| ")]


def test_the_pages_tables_are_the_generated_ones():
    page = PAGE.read_text(encoding="utf-8")
    assert _tables(page) == [trainer.table() for trainer in TRAINERS.values()]
    assert docgen.coming_from_markdown() == page
    assert "| `max_steps` | `train.steps` | |" in page  # an empty note renders as on a hand-written page
