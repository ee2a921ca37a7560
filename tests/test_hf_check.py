"""``forge-run check`` judges an ``init_from_hf`` folder before anything is built, from
``config.json`` and the safetensors headers alone (in process, through ``cli.main``):
every bad folder is an error naming the file or the field, with the rule that found it,
and the same folder repaired passes."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_core import cli
from forge_plugins.models.hf_config import ARCHITECTURES, options_from_hf_config
from forge_plugins.models.hf_fields import FIELDS
from forge_plugins.models.options import FAMILIES, LlamaOptions, ffn_hidden_size, head_dim, with_defaults

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny checkpoint of each family written by transformers (random)."""
    import torch

    root = tmp_path_factory.mktemp("hf")
    for family in FAMILIES:
        config = transformers.AutoConfig.for_model(
            family,
            vocab_size=260,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
            **({"head_dim": 8} if family == "qwen3" else {}),
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


@pytest.mark.parametrize("family", FAMILIES)
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


#: name -> (family, config.json changes, phrase of the report): a field of the wrong JSON
#: type or out of the range its meaning implies, for every family.
FIELD_CASES = {
    **{
        f"no-query-heads-{family}": (
            family,
            {"num_attention_heads": 0},
            "num_attention_heads=0 must be at least 1",
        )
        for family in FAMILIES
    },
    "heads-do-not-divide-hidden": (
        "llama",
        {"num_attention_heads": 3},
        "hidden_size=16 is not a multiple of num_attention_heads=3",
    ),
    "kv-heads-do-not-divide-heads": (
        "qwen2",
        {"num_key_value_heads": 3},
        "num_key_value_heads=3 does not divide num_attention_heads=2",
    ),
    "no-kv-heads": ("mistral", {"num_key_value_heads": 0}, "num_key_value_heads=0 must be at least 1"),
    "rope-theta-zero": (
        "qwen3",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
        "rope_parameters.rope_theta=0 must be above 0",
    ),
    "legacy-rope-theta-negative": (
        "llama",
        {"rope_parameters": None, "rope_theta": -1},
        "rope_theta=-1 must be above 0",
    ),
    "rope-factor-a-string": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "factor": "2", "rope_theta": 1e4}},
        "rope_parameters.factor='2' is not a number",
    ),
    "eps-negative": ("mistral", {"rms_norm_eps": -1e-6}, "rms_norm_eps=-1e-06 must be above 0"),
    "eps-nan": ("llama", {"rms_norm_eps": float("nan")}, "rms_norm_eps=nan is not finite"),
    "no-vocabulary": ("qwen2", {"vocab_size": 0}, "vocab_size=0 must be at least 1"),
    "ffn-negative": ("qwen3", {"intermediate_size": -4}, "intermediate_size=-4 must be at least 1"),
    "no-positions": ("llama", {"max_position_embeddings": 0}, "max_position_embeddings=0 must be at least 1"),
    "layers-a-string": ("llama", {"num_hidden_layers": "1"}, "num_hidden_layers='1' is not an integer"),
    "layers-a-bool": ("mistral", {"num_hidden_layers": True}, "num_hidden_layers=true is not an integer"),
    "hidden-a-float": ("qwen2", {"hidden_size": 16.0}, "hidden_size=16.0 is not an integer"),
    "tie-a-string": (
        "llama",
        {"tie_word_embeddings": "false"},
        "tie_word_embeddings='false' is not true or false",
    ),
    "activation-a-number": ("qwen3", {"hidden_act": 5}, "hidden_act=5 is not a string"),
    "odd-head-width": ("qwen3", {"head_dim": 7}, "head_dim=7 is odd"),
    "head-dim-zero": ("llama", {"head_dim": 0}, "head_dim=0 must be at least 1"),
    "window-zero": ("mistral", {"sliding_window": 0}, "sliding_window=0 must be at least 1"),
    "window-layers-negative": ("qwen2", {"max_window_layers": -1}, "max_window_layers=-1 must be at least 0"),
    "layer-types-short": (
        "qwen3",
        {"layer_types": []},
        "layer_types must be null or a list of num_hidden_layers=1",
    ),
    "architectures-not-a-list": ("llama", {"architectures": 5}, "architectures=5 must be a list"),
}


@pytest.mark.parametrize("name", sorted(FIELD_CASES))
def test_every_config_field_is_checked_by_type_and_range_naming_it(checkpoints, tmp_path, capsys, name):
    family, changes, phrase = FIELD_CASES[name]
    values = {k: v for k, v in changes.items() if v is not None}
    hf = folder(checkpoints, tmp_path, family, nulls=[k for k in changes if k not in values], **values)
    code, out = check(tmp_path, capsys, hf)
    assert code == 2, out
    assert "[llama.init-from-hf]" in out and f"config.json {phrase}" in out, out
    assert "resolve_options" not in out and "Error" not in out, out


def base_config(family):
    return {
        "model_type": family,
        "architectures": [ARCHITECTURES[family]],
        "vocab_size": 260,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }


#: Rope dicts whose type reads each rope key, to put a hostile value under.
ROPE_BASES = {
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 1e4,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 1e4},
}
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, 1, 2, 3, -1, 10**400])
    | st.floats()
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=4,
)


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(FAMILIES),
    where=st.sampled_from(
        [(None, f.name) for f in FIELDS]
        + [
            (None, "rope_parameters"),
            (None, "rope_scaling"),
            (None, "rope_theta"),
            (None, "layer_types"),
            (None, "partial_rotary_factor"),
        ]
        + [(rope, key) for rope, params in ROPE_BASES.items() for key in params]
    ),
    value=JSON_VALUES,
)
def test_any_value_of_any_field_is_read_or_refused_naming_the_field(family, where, value):
    """Whatever a field holds, the reading never raises: either the options it gives
    are valid (they resolve, and head width and SwiGLU size are computable) or a problem
    names the field, and then no values are given."""
    rope, key = where
    config = base_config(family)
    if rope is None:
        config[key] = value
    else:
        config["rope_parameters"] = {**ROPE_BASES[rope], key: value}
    values, problems = options_from_hf_config(config)
    if not values:
        assert problems and any(key in p for p in problems), problems
        return
    options = with_defaults(LlamaOptions(), values)
    assert head_dim(options) >= 2 and ffn_hidden_size(options) >= 1
    assert options.n_heads % options.n_kv_heads == 0


#: Where a null goes: ``(rope dict or None, key)``; ``"legacy"`` drops rope_parameters
#: first (a config.json of transformers before 5, with rope_theta at the top level).
NULLS = (
    [(None, f.name) for f in FIELDS]
    + [(None, key) for key in ("rope_parameters", "rope_scaling", "layer_types", "partial_rotary_factor")]
    + [("legacy", "rope_theta")]
    + [(rope, key) for rope, params in ROPE_BASES.items() for key in params]
    + [("yarn", key) for key in ("beta_fast", "beta_slow", "attention_factor", "truncate", "mscale")]
)


def transformers_reading(hf):
    """transformers' config and model for a folder, or ``None`` when it cannot load
    the config or build the model."""
    try:
        config = transformers.AutoConfig.from_pretrained(hf)
        return config, transformers.AutoModelForCausalLM.from_config(config)
    except Exception:
        return None


@pytest.mark.parametrize("family", FAMILIES)
def test_an_explicit_null_means_what_it_means_in_transformers(checkpoints, tmp_path, family):
    """Every field Forge reads, set to null in a real checkpoint's config.json: where
    the installed transformers loads the config and builds the model, Forge reads the
    same heads, head width, window, context, norm and rotary frequencies; where it
    cannot, Forge refuses, naming the field."""
    import torch

    from forge_plugins.models.rotary import inverse_frequencies

    original = json.loads((checkpoints / family / "config.json").read_text())
    for rope, key in NULLS:
        config = dict(original)
        if rope == "legacy":
            config.pop("rope_parameters")
        if rope in ROPE_BASES:
            config["rope_parameters"] = {**ROPE_BASES[rope], key: None}
        else:
            config[key] = None
        hf = tmp_path / f"{rope}-{key}"
        hf.mkdir()
        (hf / "config.json").write_text(json.dumps(config))
        values, problems = options_from_hf_config(config)
        theirs = transformers_reading(hf)
        case = f"{family}: {key}=null ({rope or 'top level'})"
        if theirs is None:
            assert not values and any(key in p for p in problems), (case, problems)
            continue
        assert values and not problems, (case, problems)
        hf_config, model = theirs
        attention = model.model.layers[0].self_attn
        assert values["head_dim"] == attention.head_dim, case
        assert values["n_kv_heads"] == attention.k_proj.out_features // attention.head_dim, case
        assert values["n_heads"] == attention.q_proj.out_features // attention.head_dim, case
        window = (
            hf_config.sliding_window if family == "mistral" else getattr(attention, "sliding_window", None)
        )
        assert (values["sliding_window"] or None) == window, case
        assert values["max_seq_len"] == min(hf_config.max_position_embeddings, window or 1 << 62), case
        assert (
            values["norm_eps"] == hf_config.rms_norm_eps
            and values["tie_embeddings"] is hf_config.tie_word_embeddings
        )
        inv_freq, scale = inverse_frequencies(
            values["head_dim"], values["rope_theta"], values["rope_scaling"]
        )
        rotary = model.model.rotary_emb
        torch.testing.assert_close(inv_freq, rotary.inv_freq, rtol=1e-6, atol=0, msg=case)
        assert scale == pytest.approx(rotary.attention_scaling), case


@pytest.mark.parametrize(
    "family, changes, nulls",
    [
        # Mistral's class default is a 4096 window; an explicit null is none.
        ("mistral", {"max_position_embeddings": 8192}, ["sliding_window"]),
        # use_sliding_window with no window (null), or with no windowed layer.
        ("qwen2", {"use_sliding_window": True}, ["sliding_window"]),
        ("qwen3", {"use_sliding_window": True, "sliding_window": 16}, []),
    ],
)
def test_a_null_or_unused_window_is_no_window(checkpoints, tmp_path, capsys, family, changes, nulls):
    from forge_plugins.models.hf_config import resolve_options

    hf = folder(checkpoints, tmp_path, family, nulls=nulls, **changes)
    code, out = check(tmp_path, capsys, hf)
    assert code == 0, out
    options = resolve_options(LlamaOptions(init_from_hf=str(hf)))
    assert options.sliding_window == 0
    assert options.max_seq_len == changes.get("max_position_embeddings", 64)


def test_a_layer_count_beyond_the_weights_is_refused_before_any_per_layer_work(
    checkpoints, tmp_path, capsys, monkeypatch
):
    """10 million layers in config.json, one in the weights: the count is compared with
    the layers the safetensors headers hold, and no shape is built per layer (the
    expected-shape table is never asked for, where it took minutes and a gigabyte)."""
    from forge_plugins.models import hf_keys

    real, asked = hf_keys.forge_shapes, []

    def counted(options, vocab_size):
        asked.append(options.n_layers)
        if options.n_layers > 1000:
            raise AssertionError(f"shapes built for {options.n_layers} layers")
        return real(options, vocab_size)

    monkeypatch.setattr(hf_keys, "forge_shapes", counted)
    code, out = check(tmp_path, capsys, folder(checkpoints, tmp_path / "intact"))
    assert code == 0 and asked == [1], out  # the control: the check does ask, for the weights' layers
    code, out = check(tmp_path, capsys, folder(checkpoints, tmp_path / "huge", num_hidden_layers=10_000_000))
    assert code == 2, out
    assert (
        "config.json num_hidden_layers=10000000 but the weights hold 1 layers (model.layers.0 to "
        "model.layers.0)" in out
    ), out
    assert asked == [1]


def elsewhere(hf):
    """The folder's weights moved to a sibling folder, outside it."""
    other = hf.parent / "other"
    other.mkdir()
    return (hf / "model.safetensors").rename(other / "model.safetensors")


def index_naming(hf, name):
    """The folder's weights moved out, and an index listing them all under ``name``."""
    from safetensors import safe_open

    with safe_open(elsewhere(hf), "pt") as f:
        keys = sorted(f.keys())
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(keys, name)}))


def symlinked_shard(hf):
    index_naming(hf, "model-00001-of-00001.safetensors")
    (hf / "model-00001-of-00001.safetensors").symlink_to(hf.parent / "other/model.safetensors")


OUTSIDE = {
    "parent-path": lambda hf: index_naming(hf, "../other/model.safetensors"),
    "absolute-path": lambda hf: index_naming(hf, str(hf.parent / "other/model.safetensors")),
    "symlinked-shard": symlinked_shard,
    "symlinked-single-file": lambda hf: (hf / "model.safetensors").symlink_to(elsewhere(hf)),
}


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_weight_files_outside_the_folder_are_refused(checkpoints, tmp_path, capsys, name):
    hf = folder(checkpoints, tmp_path)
    OUTSIDE[name](hf)
    code, out = check(tmp_path, capsys, hf)
    assert code == 2, out
    assert "[llama.init-from-hf]" in out and "weight files outside the folder" in out, out
    assert str((tmp_path / "other/model.safetensors").resolve()) in out, out
    if name != "symlinked-single-file":
        assert "model.safetensors.index.json names" in out and "(for 'lm_head.weight'" in out, out


def test_a_hub_cache_snapshot_whose_files_link_to_its_blobs_passes(checkpoints, tmp_path, capsys):
    """The Hugging Face hub cache keeps a model's files in ``blobs/`` and links them
    from ``snapshots/REV/``: those links stay within the model's cache folder."""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoints / "llama" / name, repo / "blobs" / f"hash-{name}")
        (snapshot / name).symlink_to(f"../../blobs/hash-{name}")
    code, out = check(tmp_path, capsys, snapshot)
    assert code == 0, out
