"""``forge-run check`` judges an ``init_from_hf`` folder before anything is built, from
``config.json`` and the safetensors headers alone (in process, through ``cli.main``):
every bad folder is an error naming the file or the field, with the rule that found it,
and the same folder repaired passes."""

from __future__ import annotations

import json
import shutil

import pytest

from forge_core import cli

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny llama, qwen2 and mistral checkpoint written by transformers (random)."""
    import torch

    root = tmp_path_factory.mktemp("hf")
    for family in ("llama", "qwen2", "mistral"):
        config = transformers.AutoConfig.for_model(
            family,
            vocab_size=260,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
        )
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(root / family)
    return root


def folder(checkpoints, tmp_path, family="llama", config=None, drop=(), nulls=(), **changes):
    """A copy of a checkpoint with ``config.json`` changed (``changes``; ``None`` removes
    a key, ``nulls`` are keys set to null), or replaced by ``config`` (a string), and
    files in ``drop`` removed."""
    out = tmp_path / "hf"
    shutil.copytree(checkpoints / family, out)
    path = out / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        data.pop(key, None) if value is None else data.__setitem__(key, value)
    data.update(dict.fromkeys(nulls))
    path.write_text(config if config is not None else json.dumps(data))
    for name in drop:
        (out / name).unlink()
    return out


def check(tmp_path, capsys, hf, **options):
    data = {
        "run": {"out_dir": str(tmp_path / "run")},
        "model": {"name": "llama", "options": {"init_from_hf": str(hf), **options}},
        "data": {"source": "stdlib", "tokenizer": "byte", "packer": "concat", "seq_len": 32},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(data))
    code = cli.main(["check", str(path)])
    return code, capsys.readouterr().out


def extra_tensor(hf):
    from safetensors.torch import load_file, save_file

    tensors = load_file(hf / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = tensors["model.norm.weight"].clone()
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})


def wrong_shape(hf):
    from safetensors.torch import load_file, save_file

    tensors = load_file(hf / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:8]
    del tensors["model.layers.0.mlp.down_proj.weight"]
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})


def lost_shard(hf):
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})
    )
    (hf / "model.safetensors").unlink()


def pickle_only(hf):
    (hf / "model.safetensors").rename(hf / "pytorch_model.bin")


#: name -> (folder changes, options, mutation of the folder, rule, phrases of the report)
CASES = {
    "missing-folder": (None, {}, None, "llama.init-from-hf", ["the folder does not exist"]),
    "no-config": ({"drop": ["config.json"]}, {}, None, "llama.init-from-hf", ["no config.json there"]),
    "config-not-json": (
        {"config": "{not json"},
        {},
        None,
        "llama.init-from-hf",
        ["config.json is not valid JSON"],
    ),
    "custom-code": (
        {"auto_map": {"AutoModelForCausalLM": "modeling_x.X"}},
        {},
        None,
        "llama.init-from-hf",
        ["names custom model code", "never runs code from model folders"],
    ),
    "no-weights": (
        {"drop": ["model.safetensors"]},
        {},
        None,
        "llama.init-from-hf",
        ["no model.safetensors (or sharded model.safetensors.index.json)"],
    ),
    "pickle-weights": (
        {},
        {},
        pickle_only,
        "llama.init-from-hf",
        ["found pytorch_model.bin: not read, pickles can run code"],
    ),
    "lost-shard": (
        {},
        {},
        lost_shard,
        "llama.init-from-hf",
        ["model.safetensors.index.json names model-00002-of-00002.safetensors, which are not there"],
    ),
    "other-model-type": (
        {"model_type": "gpt2"},
        {},
        None,
        "llama.init-from-hf",
        ["config.json model_type is 'gpt2'", "LlamaForCausalLM"],
    ),
    "head-less-architecture": (
        {"architectures": ["LlamaForSequenceClassification"]},
        {},
        None,
        "llama.init-from-hf",
        ["config.json architectures is ['LlamaForSequenceClassification']"],
    ),
    "longrope": (
        {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
        {},
        None,
        "llama.init-from-hf",
        ["rope type 'longrope' is not supported"],
    ),
    "qwen-sliding-window": (
        # layer_types left out: the layers from max_window_layers on are windowed.
        {
            "family": "qwen2",
            "use_sliding_window": True,
            "sliding_window": 16,
            "max_window_layers": 0,
            "layer_types": None,
        },
        {},
        None,
        "llama.init-from-hf",
        ["use_sliding_window=true with sliding_window=16: 1 of the 1 layers attend within the window"],
    ),
    "activation": ({"hidden_act": "gelu"}, {}, None, "llama.init-from-hf", ["hidden_act='gelu'"]),
    "no-hidden-size": (
        {"hidden_size": None},
        {},
        None,
        "llama.init-from-hf",
        ["config.json has no integer 'hidden_size'"],
    ),
    "explicit-mismatch": (
        {},
        {"dim": 32, "n_kv_heads": 2},
        None,
        "llama.init-from-hf",
        [
            "model.options.dim=32 but config.json hidden_size=16",
            "model.options.n_kv_heads=2 but config.json num_key_value_heads=1",
        ],
    ),
    "weights-do-not-fit": (
        {},
        {},
        wrong_shape,
        "llama.init-from-hf",
        [
            "model.layers.0.mlp.up_proj.weight has shape [8, 16], the options need [32, 16]",
            "weights missing for 1 tensors: model.layers.0.mlp.down_proj.weight",
        ],
    ),
    "unread-tensor": (
        {},
        {},
        extra_tensor,
        "llama.init-from-hf",
        ["1 tensors of the checkpoint have no place in the model: model.layers.0.self_attn.q_proj.bias"],
    ),
    "short-sliding-window": (
        {"family": "mistral", "sliding_window": 16},
        {"max_seq_len": 64},
        None,
        "llama.sliding-window",
        ["sliding_window=16 is shorter than max_seq_len=64"],
    ),
    "dynamic-beyond-context": (
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
        {"max_seq_len": 128},
        None,
        "llama.rope-scaling",
        ["max_seq_len=128 beyond original_max_position_embeddings=64"],
    ),
    "bias-outside-family": (
        {"family": "qwen2"},
        {"attention_bias": True},
        None,
        "llama.family-options",
        ["attention_bias=true with family 'qwen2'"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_refuses_a_bad_folder_naming_the_file_or_field(checkpoints, tmp_path, capsys, name):
    changes, options, mutate, rule, phrases = CASES[name]
    if changes is None:
        hf = tmp_path / "absent"
    else:
        changes = dict(changes)
        hf = folder(checkpoints, tmp_path, changes.pop("family", "llama"), **changes)
    if mutate is not None:
        mutate(hf)
    code, out = check(tmp_path, capsys, hf, **options)
    assert code == 2, out
    assert f"[{rule}]" in out, out
    for phrase in phrases:
        assert phrase in out, out


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_the_unchanged_folder_passes_with_no_option_typed(checkpoints, tmp_path, capsys, family):
    code, out = check(tmp_path, capsys, folder(checkpoints, tmp_path, family))
    assert code == 0, out
    # Mistral's window (4096, transformers' default) is longer than the 64 positions.
    assert "valid: 0 error(s)" in out


def test_parallel_rules_judge_the_checkpoint_shapes(checkpoints, tmp_path, capsys):
    """The tp/pp rules read the model's facts, which come from config.json when no shape
    is typed: this checkpoint has 1 key/value head and 1 layer, so tp=2 and pp=2 are
    refused (the defaults, 4 kv heads and 4 layers, would pass both)."""
    hf = folder(checkpoints, tmp_path)
    path = tmp_path / "config.yaml"
    for override, phrase in (
        ("parallel.tp=2", "model 'llama' has 1 key/value heads, not divisible by parallel.tp = 2"),
        ("parallel.pp=2", "model 'llama' has 1 layers, fewer than the 2 pipeline stages"),
    ):
        check(tmp_path, capsys, hf)  # writes config.yaml
        code = cli.main(["check", str(path), "--world-size", "2", override])
        out = capsys.readouterr().out
        assert code == 2 and phrase in out, out
    code = cli.main(
        ["check", str(path), "--world-size", "2", "parallel.tp=2", "model.options.init_from_hf=''"]
    )
    out = capsys.readouterr().out
    assert code == 0, out  # the same config without the checkpoint: default shapes divide
