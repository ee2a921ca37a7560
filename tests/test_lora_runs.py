"""LoRA runs end to end, in process: a tiny Hugging Face llama as the base, adapters
trained on it, checkpoints of the adapters alone, bit-exact resume, and ``eval``,
``sample`` and ``export-hf`` (merged, and as a PEFT folder that ``peft`` loads onto the
base with the same logits)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_hf_runs import checkpoint as hf_checkpoint
from test_lora import TARGETS
from train_helpers import read_metrics, tiny_config, write_config

from forge_core import cli
from forge_core.generate import load_for_inference
from forge_core.testing import assert_within_rounding, longest_sum

transformers = pytest.importorskip("transformers")

STEPS = 4


def lora_run_config(tmp, name, base, **train):
    config = tiny_config(
        tmp,
        name,
        train={"steps": STEPS, "lr": 2e-2, "warmup_steps": 0, **train},
        checkpoint={"every": 2, "keep": 3},
        logging={"loggers": ["jsonl"]},
    )
    config["data"]["heldout"] = {"fraction": 0.1}
    config["model"] = {
        "name": "llama",
        "options": {"init_from_hf": str(base)},
        "transforms": ["lora"],
        "transform_options": {"lora": {"rank": 4, "alpha": 8.0, "targets": TARGETS}},
    }
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    hf_checkpoint(tmp / "base", "llama")
    config = write_config(tmp / "lora.yaml", lora_run_config(tmp, "lora", tmp / "base"))
    assert cli.main([config]) == 0
    # The same run stopped after the checkpoint of step 2 (its later files taken away),
    # then resumed to the end.
    shutil.copytree(tmp / "lora", tmp / "split", ignore=shutil.ignore_patterns("step-000004", "*.lock"))
    (tmp / "split/checkpoints/latest").write_text("step-000002\n")
    metrics = tmp / "split/metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))
    split = write_config(tmp / "split.yaml", lora_run_config(tmp, "split", tmp / "base"))
    assert cli.main([split]) == 0
    return tmp


def test_the_checkpoint_holds_only_the_adapters_and_the_base_identity(runs):
    from torch.distributed.checkpoint import FileSystemReader

    step = runs / "lora/checkpoints/step-000004"
    keys = [
        k for k in FileSystemReader(str(step)).read_metadata().state_dict_metadata if k.startswith("model.")
    ]
    assert len(keys) == 2 * len(TARGETS) * 2
    assert all(".lora_A." in k or ".lora_B." in k for k in keys), keys
    state = json.loads((step / "train_state-rank00000.json").read_text())
    assert state["base_identity"].startswith("pretrained:base:sha256:")


def test_the_adapters_learn(runs):
    losses = [r["loss"] for r in read_metrics(runs / "lora")]
    assert len(losses) == STEPS and losses[-1] < losses[0]


def test_a_resumed_adapter_run_equals_the_uninterrupted_one_bit_for_bit(runs):
    whole = read_metrics(runs / "lora")
    split = read_metrics(runs / "split")
    assert [r["step"] for r in split] == [1, 2, 3, 4]
    for key in ("loss", "grad_norm", "lr"):
        assert [r[key] for r in split] == [r[key] for r in whole], key


def test_eval_and_sample_of_an_adapter_run(runs, capsys):
    assert cli.main(["eval", str(runs / "lora"), "--json", "eval.max_batches=2"]) == 0
    loss = json.loads(capsys.readouterr().out)["loss"]
    assert 0 < loss < 10
    args = ["sample", str(runs / "lora"), "--temperature", "0", "--max-new-tokens", "8", "--prompt", "the"]
    assert cli.main(args) == 0
    assert "tokens sampled" in capsys.readouterr().err


def _ids():
    return torch.tensor([[116, 104, 101, 32, 108, 97, 122, 121, 32, 100, 111, 103]])


def test_the_merged_export_computes_the_adapted_model(runs):
    assert cli.main(["export-hf", str(runs / "lora"), str(runs / "merged")]) == 0
    model, *_ = load_for_inference(runs / "lora")
    hf = transformers.AutoModelForCausalLM.from_pretrained(runs / "merged").eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(runs / "base").eval()
    with torch.no_grad():
        adapted = model(_ids())
        assert not torch.allclose(base(_ids()).logits, adapted, atol=1e-3)  # the adapters matter
        # The merged weights are float32, rounded once: two libraries, two summation orders.
        assert_within_rounding(
            hf(_ids()).logits,
            adapted,
            dtype=torch.float32,
            terms=longest_sum(model, _ids().shape[1]),
            what="the merged export's logits in transformers",
        )


def test_a_peft_folder_loads_onto_the_base_with_the_adapted_logits(runs):
    peft = pytest.importorskip("peft")
    assert cli.main(["export-hf", str(runs / "lora"), str(runs / "adapter"), "--adapter"]) == 0
    assert sorted(p.name for p in (runs / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    base = transformers.AutoModelForCausalLM.from_pretrained(runs / "base")
    loaded = peft.PeftModel.from_pretrained(base, str(runs / "adapter")).eval()
    model, *_ = load_for_inference(runs / "lora")
    with torch.no_grad():
        assert_within_rounding(
            loaded(_ids()).logits,
            model(_ids()),
            dtype=torch.float32,
            terms=longest_sum(model, _ids().shape[1]),
            what="peft's model of the exported adapters",
        )


def test_adapters_are_refused_on_another_base(runs, capsys):
    other = runs / "other-base"
    shutil.copytree(runs / "base", other)
    weights = json.loads((other / "config.json").read_text())
    weights["rms_norm_eps"] = 1e-5  # same shapes, another model
    (other / "config.json").write_text(json.dumps(weights))
    swapped = f"model.options.init_from_hf={other}"
    assert cli.main(["eval", str(runs / "lora"), swapped]) == 2
    said = capsys.readouterr().err
    assert "holds adapters trained on another base" in said and str(other) in said
    assert cli.main([str(runs / "lora.yaml"), swapped, "train.steps=6"]) == 2
    assert "holds adapters trained on another base" in capsys.readouterr().err


# --- what an adapter run depends on is never lost -----------------------------------


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["the-base", "inside", "link-to-base"])
def test_export_over_the_base_of_an_adapter_run_is_refused(runs, capsys, where):
    before = _tree(runs / "base")
    out = {"the-base": runs / "base", "inside": runs / "base/hf", "link-to-base": runs / "base-link"}[where]
    if where == "link-to-base":
        out.symlink_to(runs / "base", target_is_directory=True)
    try:
        assert cli.main(["export-hf", str(runs / "lora"), str(out), "--overwrite"]) == 2
    finally:
        if where == "link-to-base":
            out.unlink()
    said = capsys.readouterr().err
    assert "the base model of the run" in said and str(runs / "lora") in said, said
    assert "unusable" in said and "Traceback" not in said
    assert _tree(runs / "base") == before


@pytest.mark.parametrize(
    "override, said",
    [
        (
            "model.transform_options.lora.targets=[attention.q]",
            'model.transform_options.lora.targets: checkpoint has ["attention.q", "attention.k"',
        ),
        ("model.transform_options.lora.rank=8", "lora.rank: checkpoint has 4, config has 8"),
        ("model.transform_options.lora.alpha=4.0", "lora.alpha: checkpoint has 8.0, config has 4.0"),
    ],
)
def test_resuming_with_other_adapter_settings_is_refused_saying_what_differs(runs, capsys, override, said):
    before = _tree(runs / "lora/checkpoints")
    assert cli.main([str(runs / "lora.yaml"), override, "train.steps=6"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Set them back" in err and "Traceback" not in err, err
    assert _tree(runs / "lora/checkpoints") == before


def test_a_run_starts_from_another_runs_adapters_at_step_0(runs):
    """Step 0 of the new run holds the other run's final adapters bit for bit; its
    optimizer and step are its own."""
    from forge_core.api import hookimpl
    from forge_core.testing import train_in_process

    seen = {}

    class AtStart:
        @hookimpl
        def forge_train_start(self, run):
            seen["step"] = run.start_step
            model = run.view.parts[0]
            seen["adapters"] = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}

    config = lora_run_config(runs, "next", runs / "base", steps=1)
    config["model"]["init_adapters_from"] = str(runs / "lora")
    train_in_process(write_config(runs / "next.yaml", config), extra_plugins=(("at-start", AtStart()),))
    source, *_ = load_for_inference(runs / "lora")
    final = {k: v for k, v in source.named_parameters() if "_lora." in k}
    assert seen["step"] == 0 and sorted(seen["adapters"]) == sorted(final) and final
    for key, value in final.items():
        assert torch.equal(seen["adapters"][key], value), key
    state = json.loads((runs / "next/checkpoints/step-000001/train_state-rank00000.json").read_text())
    assert state["step"] == 1


def test_starting_from_adapters_of_another_shape_or_base_is_refused(runs, capsys, tmp_path):
    config = lora_run_config(tmp_path, "next", runs / "base")
    config["model"]["init_adapters_from"] = str(runs / "lora/checkpoints/step-000002")
    config["model"]["transform_options"]["lora"]["rank"] = 8
    assert cli.main([write_config(tmp_path / "rank.yaml", config)]) == 2
    err = capsys.readouterr().err
    assert "model.transform_options.lora.rank: checkpoint has 4, config has 8" in err, err
    assert "To start from its adapters" in err and not (tmp_path / "next/config.yaml").exists()
    other = tmp_path / "other-base"
    shutil.copytree(runs / "base", other)
    weights = json.loads((other / "config.json").read_text())
    weights["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(weights))
    config = lora_run_config(tmp_path, "next", other)
    config["model"]["init_adapters_from"] = str(runs / "lora")
    assert cli.main([write_config(tmp_path / "base.yaml", config)]) == 2
    err = capsys.readouterr().err
    assert "another base" in err and "give this run the base" in err, err
    config["model"]["transforms"] = []
    assert cli.main(["check", write_config(tmp_path / "none.yaml", config)]) == 2
    assert "model.adapters-from-needs-adapters" in capsys.readouterr().out


def test_dpo_from_sft_adapters_has_the_sft_policy_as_its_reference(runs, tmp_path):
    """DPO started from a LoRA run's adapters: its reference is the model it starts as
    (base + those adapters), so the first step's margin is 0 and its loss log 2. With the
    adapters switched off as the reference (the bare base), the trained adapters would
    part policy from reference from the first step."""
    import math

    with open(tmp_path / "pairs.jsonl", "w") as f:
        for i in range(16):
            good, bad = ("yes", "no") if i % 2 else ("no", "yes")
            f.write(json.dumps({"prompt": f"{good[0]}{i}", "chosen": good, "rejected": bad}) + "\n")
    (tmp_path / "short.jinja").write_text(
        "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}"
    )
    config = lora_run_config(tmp_path, "dpo", runs / "base", steps=1, objective="dpo", batch_size=4)
    config["model"]["init_adapters_from"] = str(runs / "lora")
    config["data"] = {
        "source": "text",
        "source_options": {"paths": [str(tmp_path / "pairs.jsonl")]},
        "tokenizer": "byte",
        "packer": "bfd",
        "seq_len": 32,
        "chat": {"format": "preference", "template": str(tmp_path / "short.jinja")},
        "cache": {"dir": str(tmp_path / "cache")},
    }
    assert cli.main([write_config(tmp_path / "dpo.yaml", config)]) == 0
    first = read_metrics(tmp_path / "dpo")[0]
    assert abs(first["loss"] - math.log(2)) < 1e-6 and abs(first["dpo/reward_margin"]) < 1e-6, first


def test_a_checkpoint_without_recorded_settings_is_compared_by_what_it_holds(tmp_path, monkeypatch, capsys):
    """Checkpoints of an older Forge record no adapter settings: fewer targets or another
    rank is refused from the adapters the checkpoint holds, before config.yaml changes."""
    from test_lora import lora_config

    import forge_core.train.trainer as trainer

    config = write_config(
        tmp_path / "c.yaml", lora_config(tmp_path, "run", train={"steps": 2, "batch_size": 4})
    )
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "transform_settings", lambda plan: None)
        assert cli.main([config]) == 0
    saved = (tmp_path / "run/config.yaml").read_bytes()
    for override, said in (
        (
            "model.transform_options.lora.targets=[attention.q]",
            "wk_lora.lora_A.weight: in the checkpoint, not in",
        ),
        (
            "model.transform_options.lora.rank=8",
            "wq_lora.lora_A.weight: shape [4, 32] in the checkpoint, [8, 32]",
        ),
    ):
        assert cli.main([config, override, "train.steps=4"]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
        assert (tmp_path / "run/config.yaml").read_bytes() == saved
