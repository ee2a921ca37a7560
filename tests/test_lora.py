"""The model-transform kind and its first built-in, LoRA: applied where every command
builds the model, base frozen, adapters only in the optimizer and the checkpoints."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from train_helpers import tiny_config, write_config

from forge_core import components
from forge_core.api import transforms_disabled
from forge_core.api.unstable import applied_transforms
from forge_core.config.loader import load_config
from forge_core.judge import judge_config
from forge_core.registry import load_registries
from forge_plugins.transforms.lora import Lora

TARGETS = ["attention.q", "attention.k", "attention.v", "attention.o", "mlp.gate", "mlp.up", "mlp.down"]


def lora_config(tmp_path: Path, name: str = "run", lora: dict | None = None, **sections) -> dict:
    config = tiny_config(tmp_path, name, **sections)
    config["model"]["transforms"] = ["lora"]
    config["model"]["transform_options"] = {"lora": {"rank": 4, "targets": TARGETS, **(lora or {})}}
    return config


def plan_of(tmp_path: Path, config: dict, world_size: int = 1):
    registries = load_registries()
    loaded = load_config(write_config(tmp_path / "config.yaml", config), [], registries)
    judged = judge_config(loaded, registries, world_size=world_size)
    assert not judged.errors, [str(v) for v in judged.errors]
    return judged.plan, registries


def build(tmp_path: Path, config: dict) -> torch.nn.Module:
    plan, registries = plan_of(tmp_path, config)
    torch.manual_seed(0)
    return components.model(plan, registries, 256, components.attention(plan, registries))


def test_the_model_of_every_command_has_the_adapters_and_starts_as_the_base(tmp_path):
    base = build(tmp_path, tiny_config(tmp_path))
    adapted = build(tmp_path, lora_config(tmp_path))
    assert [t.name for t in applied_transforms(adapted)] == ["lora"]
    x = torch.randint(0, 256, (2, 16))
    # B starts at zero: the adapted model's first forward is the base model's, bit for bit.
    assert torch.equal(adapted(x), base(x))
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * len(TARGETS) * 2  # A and B, every role, both blocks
    # Every base parameter keeps its name: the base model's state is a subset.
    assert set(base.state_dict()) <= set(adapted.state_dict())


def test_adapters_disabled_give_the_base_model_and_come_back(tmp_path):
    base = build(tmp_path, tiny_config(tmp_path))
    adapted = build(tmp_path, lora_config(tmp_path))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if ".lora_B." in name:
                param.normal_()
    x = torch.randint(0, 256, (2, 16))
    moved = adapted(x)
    assert not torch.allclose(moved, base(x))
    with transforms_disabled(adapted):
        assert torch.equal(adapted(x), base(x))
    assert torch.equal(adapted(x), moved)


def test_gradients_reach_only_the_adapters(tmp_path):
    adapted = build(tmp_path, lora_config(tmp_path))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.1)
    x = torch.randint(0, 256, (2, 16))
    adapted(x).logsumexp(-1).sum().backward()
    for name, param in adapted.named_parameters():
        is_adapter = ".lora_A." in name or ".lora_B." in name
        assert (param.grad is not None) == is_adapter, name
        if is_adapter:
            assert param.grad.abs().sum() > 0, name


def test_merging_folds_the_adapters_into_the_base_weights(tmp_path):
    from forge_core.api.transforms import merge_transforms

    base = build(tmp_path, tiny_config(tmp_path)).double()
    adapted = build(tmp_path, lora_config(tmp_path, lora={"dropout": 0.5})).double().eval()
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.1)
        x = torch.randint(0, 256, (2, 16))
        expected = adapted(x)
        merge_transforms(adapted)
        assert applied_transforms(adapted) == ()
        assert sorted(adapted.state_dict()) == sorted(base.state_dict())  # a plain model again
        torch.testing.assert_close(adapted(x), expected, rtol=1e-12, atol=1e-12)
        assert not torch.allclose(base(x), expected, atol=1e-3)


@pytest.mark.parametrize(
    ("lora", "path", "said"),
    [
        ({"rank": 0}, "$.model.transform_options.lora.rank", "at least 1"),
        ({"alpha": 0}, "$.model.transform_options.lora.alpha", "above 0"),
        ({"dropout": 1.0}, "$.model.transform_options.lora.dropout", "1"),
        ({"targets": []}, "$.model.transform_options.lora.targets", "non-empty"),
    ],
)
def test_bad_options_are_refused_naming_the_path(tmp_path, lora, path, said):
    from forge_core.api import ForgeError

    registries = load_registries()
    with pytest.raises(ForgeError) as err:
        load_config(write_config(tmp_path / "c.yaml", lora_config(tmp_path, lora=lora)), [], registries)
    assert path in str(err.value) and said in str(err.value)


def test_a_target_that_is_a_module_name_is_refused_with_the_roles(tmp_path):
    registries = load_registries()
    wrong = lora_config(tmp_path, lora={"targets": ["attention.wq", "mlp.upp"]})
    config = load_config(write_config(tmp_path / "c.yaml", wrong), [], registries)
    errors = judge_config(config, registries, world_size=1).errors
    message = " | ".join(v.message for v in errors if v.rule_id == "lora.targets-are-roles")
    assert "targets[0] = 'attention.wq' is not a role" in message
    assert "did you mean 'mlp.up'" in message.lower()
    assert "attention.q" in message and "mlp.down" in message


MOE = {"num_experts": 4, "top_k": 2, "expert_hidden": 16}


def test_on_a_mixture_of_experts_model_the_mlp_roles_adapt_the_dense_blocks_only(tmp_path):
    config = lora_config(tmp_path)
    config["model"]["options"]["moe"] = {**MOE, "layers": [1]}
    adapted = build(tmp_path, config)
    adapters = {n.split(".lora_")[0] for n, p in adapted.named_parameters() if p.requires_grad}
    assert "layers.0.feed_forward.w3_lora" in adapters
    assert not any(n.startswith("layers.1.feed_forward") for n in adapters)
    assert "layers.1.attention.wq_lora" in adapters


def test_mlp_roles_on_a_model_whose_every_block_routes_are_refused_by_check(tmp_path):
    registries = load_registries()
    config = lora_config(tmp_path, lora={"targets": ["attention.q", "mlp.up"]})
    config["model"]["options"]["moe"] = {**MOE, "every": 1}
    loaded = load_config(write_config(tmp_path / "c.yaml", config), [], registries)
    errors = judge_config(loaded, registries, world_size=1).errors
    message = " | ".join(v.message for v in errors if v.rule_id == "lora.targets-are-roles")
    assert "targets[1] = 'mlp.up' is not a role" in message


def lora_section() -> str:
    """The ``## LoRA`` section of docs/fine-tuning.md (the page has one per topic)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "fine-tuning.md").read_text()
    start = text.index("\n## LoRA\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def test_the_lora_section_of_the_fine_tuning_page_runs_as_pasted(tmp_path):
    from doc_chapters import code_blocks, play_chapters

    section = lora_section()
    commands = [b for b in code_blocks(section) if b.lang == "console"]
    assert commands and all(b.runnable for b in commands)
    played = play_chapters({"docs/fine-tuning.md#lora": section}, tmp_path)
    assert played["docs/fine-tuning.md#lora"] is None, played["docs/fine-tuning.md#lora"]


def test_lora_passes_the_kits_transform_check():
    from forge_core.testing import check_transform

    report = check_transform("lora", options={"rank": 2, "dropout": 0.1, "targets": TARGETS})
    assert report.checked == ("names", "initialize", "detached", "disabled", "merge")
    assert len(report.added) == 2 * len(TARGETS) * 2


class DisablesNothing(Lora):
    """A broken transform for the kit's negative control: LoRA whose disabled() leaves
    the adapters on."""

    def disabled(self, module):
        return contextlib.nullcontext()


def test_the_kit_refuses_a_transform_whose_disabled_leaves_it_on():
    from forge_core.api import TransformSpec
    from forge_core.testing import check_transform
    from forge_plugins.transforms.options import LoraOptions

    spec = TransformSpec(
        name="leaky",
        summary="x",
        impl="test_lora:DisablesNothing",
        options=LoraOptions,
        saves_trainable_only=True,
    )
    with pytest.raises(AssertionError, match=r"transform 'leaky': disabled\(\)"):
        check_transform(spec)


def test_a_transform_listed_twice_is_refused_and_unused_options_are_warned_about(tmp_path):
    registries = load_registries()
    twice = lora_config(tmp_path)
    twice["model"]["transforms"] = ["lora", "lora"]
    judged = judge_config(
        load_config(write_config(tmp_path / "a.yaml", twice), [], registries), registries, 1
    )
    assert [v.rule_id for v in judged.errors] == ["model.transforms-once"]
    unused = lora_config(tmp_path)
    unused["model"]["transforms"] = []
    judged = judge_config(
        load_config(write_config(tmp_path / "b.yaml", unused), [], registries), registries, 1
    )
    assert not judged.errors
    assert "model.transform-options-used" in [v.rule_id for v in judged.warnings]


def test_export_of_an_adapter_folder_is_refused_for_a_model_without_one(tmp_path):
    from forge_core.api import ForgeError
    from forge_core.cli.export import _export_adapter

    plan, _ = plan_of(tmp_path, tiny_config(tmp_path))
    with pytest.raises(ForgeError, match=r"export-hf --adapter: the run's model.transforms \[\] have no"):
        _export_adapter(
            build(tmp_path, tiny_config(tmp_path)), plan, tmp_path, tmp_path / "out", tmp_path / "out"
        )
    assert not (tmp_path / "out").exists()
