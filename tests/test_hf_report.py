"""The family report: on a real-shaped ``config.json`` (tiny sizes, the published files'
keys), ``forge-run check`` and ``init_from_hf`` name exactly the fields Forge would not
honour: an architecture it does not import is refused with the list of what is missing,
and a family it imports is refused naming each field it would ignore, with the value and
the fix. The same files without those fields pass."""

from __future__ import annotations

import json
import re

import pytest
from hub_cache import random_checkpoint

from forge_core import cli
from forge_plugins.models.hf_config import options_from_hf_config
from forge_plugins.models.hf_report import IGNORED, READ

#: Llama 3.1's config.json (transformers 4.43), at tiny sizes.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 16,
    "initializer_range": 0.02,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "num_key_value_heads": 1,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 260,
}
#: SmolLM2's (a llama written by nanotron), and DeepSeek-R1-Distill-Qwen's (a qwen2).
SMOLLM2 = {**LLAMA, "is_llama_config": True, "rope_interleaved": False, "rope_scaling": None}
R1_DISTILL = {"use_mrope": False, "sliding_window": 4096, "max_window_layers": 28}
#: Qwen2.5's.
QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 16,
    "initializer_range": 0.02,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "max_window_layers": 1,
    "model_type": "qwen2",
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 64,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 260,
}
#: OLMo-2-1124-7B's.
OLMO2 = {
    "architectures": ["Olmo2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "eos_token_id": 100257,
    "hidden_act": "silu",
    "hidden_size": 16,
    "initializer_range": 0.02,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "model_type": "olmo2",
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "num_key_value_heads": 2,
    "pad_token_id": 100277,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 500000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.47.0.dev0",
    "use_cache": True,
    "vocab_size": 260,
}
_SHAPES = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "vocab_size": 260,
    "rms_norm_eps": 1e-06,
}
#: Families Forge does not import, as transformers 5 writes them (tiny sizes), with the
#: fields their report must name, exactly.
UNSUPPORTED = {
    "gemma3_text": (
        {
            **_SHAPES,
            "_sliding_window_pattern": 6,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": None,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "final_logit_softcapping": None,
            "head_dim": 8,
            "hidden_activation": "gelu_pytorch_tanh",
            "layer_types": ["sliding_attention"],
            "model_type": "gemma3_text",
            "query_pre_attn_scalar": 8,
            "rope_parameters": {
                "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "sliding_window": 16,
            "tie_word_embeddings": True,
            "use_bidirectional_attention": False,
        },
        {
            "_sliding_window_pattern",
            "hidden_activation",
            "layer_types",
            "query_pre_attn_scalar",
            "sliding_window",
            "use_bidirectional_attention",
        },
    ),
    "phi3": (
        {
            **_SHAPES,
            "embd_pdrop": 0.0,
            "hidden_act": "silu",
            "model_type": "phi3",
            "original_max_position_embeddings": 64,
            "resid_pdrop": 0.0,
            "rope_parameters": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"},
            "sliding_window": None,
        },
        {"original_max_position_embeddings"},
    ),
    "deepseek_v3": (
        {
            **_SHAPES,
            "attention_bias": False,
            "first_k_dense_replace": 1,
            "head_dim": 4,
            "kv_lora_rank": 8,
            "model_type": "deepseek_v3",
            "moe_intermediate_size": 8,
            "n_group": 2,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "norm_topk_prob": True,
            "num_experts_per_tok": 2,
            "num_nextn_predict_layers": 1,
            "output_router_logits": False,
            "pretraining_tp": 1,
            "q_lora_rank": 8,
            "qk_head_dim": 12,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4,
            "rope_interleave": True,
            "routed_scaling_factor": 2.5,
            "topk_group": 1,
            "v_head_dim": 8,
        },
        {
            "first_k_dense_replace",
            "kv_lora_rank",
            "moe_intermediate_size",
            "n_group",
            "n_routed_experts",
            "n_shared_experts",
            "norm_topk_prob",
            "num_experts_per_tok",
            "num_nextn_predict_layers",
            "q_lora_rank",
            "qk_head_dim",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "rope_interleave",
            "routed_scaling_factor",
            "topk_group",
            "v_head_dim",
        },
    ),
    "gpt_oss": (
        {
            **_SHAPES,
            "attention_bias": True,
            "head_dim": 8,
            "layer_types": ["sliding_attention"],
            "model_type": "gpt_oss",
            "num_experts_per_tok": 2,
            "num_local_experts": 4,
            "router_aux_loss_coef": 0.001,
            "rope_parameters": {
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "factor": 32.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 150000.0,
                "rope_type": "yarn",
                "truncate": False,
            },
            "sliding_window": 8,
            "swiglu_alpha": 1.702,
            "swiglu_limit": 7.0,
        },
        {
            "attention_bias",
            "layer_types",
            "num_experts_per_tok",
            "num_local_experts",
            "sliding_window",
            "swiglu_alpha",
            "swiglu_limit",
        },
    ),
}


def named_fields(problems: list[str]) -> set[str]:
    """The config.json fields the problems name (``config.json KEY=``)."""
    return {m.group(1) for p in problems for m in re.finditer(r"config\.json ([\w.]+)=", p)}


def check(tmp_path, capsys, hf):
    data = {
        "run": {"out_dir": str(tmp_path / "run")},
        "model": {"name": "llama", "options": {"init_from_hf": str(hf)}},
        "data": {"source": "stdlib", "tokenizer": "byte", "packer": "concat", "seq_len": 32},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(data))
    return cli.main(["check", str(path)]), capsys.readouterr().out


def config_only(tmp_path, config):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(config))
    return hf


@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED))
def test_an_unsupported_family_is_refused_with_exactly_the_fields_it_needs(tmp_path, capsys, model_type):
    config, expected = UNSUPPORTED[model_type]
    values, problems = options_from_hf_config(config)
    assert not values
    listing = [p for p in problems if "that Forge does not honour" in p]
    assert len(listing) == 1, problems
    shown = listing[0].split("does not honour: ", 1)[1]
    assert {item.split("=", 1)[0] for item in shown.split(", ") if "=" in item} >= expected
    assert all(f"{key}=" in shown for key in expected), shown
    # Exactly those: no other field is listed (a null, a harmless value, a common field).
    others = set(config) - expected
    assert not any(re.search(rf"(^|, ){re.escape(key)}=", shown) for key in others), shown
    code, out = check(tmp_path, capsys, config_only(tmp_path, config))
    assert code == 2 and "[llama.init-from-hf]" in out, out
    assert f"config.json model_type is '{model_type}'" in out
    assert f"a {model_type} model needs what Forge's llama lacks:" in out, out


#: (base, changes, {field named: phrase of its problem}) for families Forge imports.
IGNORED_FIELD = {
    "llama-sliding-window": (
        LLAMA,
        {"sliding_window": 4096},
        {
            "sliding_window": "config.json sliding_window=4096 is not a field Forge reads for a llama "
            "checkpoint, so Forge would build the model without it; if transformers' LlamaForCausalLM "
            "has no such field either"
        },
    ),
    "llama-unknown-rope-type": (
        LLAMA,
        {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}},
        {"rope_scaling.rope_type": "rope type 'longrope' is not supported"},
    ),
    "llama3-rope-with-a-yarn-key": (
        LLAMA,
        {"rope_scaling": {**LLAMA["rope_scaling"], "mscale": 1.0}},
        {"rope_scaling.mscale": "config.json rope_scaling.mscale=1.0 is not read by a 'llama3' rotary"},
    ),
    "qwen2-attention-bias": (
        QWEN2,
        {"attention_bias": True},
        {
            "attention_bias": "config.json attention_bias=true: biases this family's architecture does "
            "not have: transformers builds this family without them"
        },
    ),
    "olmo2-attention-dropout": (
        OLMO2,
        {"attention_dropout": 0.1},
        {
            "attention_dropout": "config.json attention_dropout=0.1: dropout on the attention weights: "
            "Forge's model applies no dropout; set it to 0"
        },
    ),
    "olmo2-sliding-window": (
        OLMO2,
        {"sliding_window": 32},
        {"sliding_window": "config.json sliding_window=32 is not a field Forge reads for a olmo2 checkpoint"},
    ),
    "interleaved-rotary": (
        SMOLLM2,
        {"rope_interleaved": True},
        {"rope_interleaved": "config.json rope_interleaved=true: rotary on interleaved channel pairs: "},
    ),
    "quantized-weights": (
        QWEN2,
        {"quantization_config": {"quant_method": "fp8"}},
        {"quantization_config": "config.json quantization_config={'quant_method': 'fp8'} is not a field"},
    ),
    "every-problem-at-once": (
        LLAMA,
        {"rms_norm_eps": "1e-5", "clip_qkv": 8.0, "use_sliding_window": True},
        {
            "rms_norm_eps": "config.json rms_norm_eps='1e-5' is not a number",
            "clip_qkv": "config.json clip_qkv=8.0 is not a field Forge reads",
            "use_sliding_window": "config.json use_sliding_window=true: a switch of qwen's windowed layers",
        },
    ),
}


@pytest.mark.parametrize("name", sorted(IGNORED_FIELD))
def test_a_field_forge_would_ignore_is_refused_naming_it_its_value_and_the_fix(tmp_path, capsys, name):
    base, changes, expected = IGNORED_FIELD[name]
    config = {**base, **changes}
    _, problems = options_from_hf_config(config)
    named = {key.replace(".type", ".rope_type") for key in named_fields(problems)}
    assert named == set(expected), problems
    for phrase in expected.values():
        assert any(phrase in p for p in problems), (phrase, problems)
    code, out = check(tmp_path, capsys, config_only(tmp_path, config))
    assert code == 2 and "[llama.init-from-hf]" in out, out


@pytest.mark.parametrize(
    "base",
    [LLAMA, QWEN2, OLMO2, SMOLLM2, {**QWEN2, **R1_DISTILL}],
    ids=["llama", "qwen2", "olmo2", "smollm2", "r1-distill-qwen"],
)
def test_the_published_files_pass_and_so_does_the_run(tmp_path, capsys, base):
    """The control: every key of the published files is read or ignored with its reason,
    so check passes (and the build loads them) with no field reported."""
    assert not options_from_hf_config(base)[1]
    hf = random_checkpoint(tmp_path / "hf", base)
    code, out = check(tmp_path, capsys, hf)
    assert code == 0, out


def test_init_from_hf_at_run_time_refuses_the_same_field(tmp_path):
    from forge_core.api import ForgeError
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    hf = random_checkpoint(tmp_path / "hf", OLMO2)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "qk_layernorm": True}))
    with pytest.raises(ForgeError, match=r"config\.json qk_layernorm=true is not a field Forge reads"):
        build(LlamaOptions(init_from_hf=str(hf)), 260, SdpaAttention(SdpaOptions()))


def test_the_ignored_fields_and_the_read_ones_do_not_overlap():
    """A key is read or ignored, never both (an ignored key a family reads would hide
    nothing, but its reason would be a lie)."""
    assert IGNORED and not set(IGNORED) & set(READ)


@pytest.mark.parametrize(
    "options",
    [
        {"family": "llama", "attention_bias": True, "mlp_bias": True},
        {"family": "qwen2", "tie_embeddings": True},
        {"family": "qwen3"},
        {"family": "mistral", "sliding_window": 64},
        {"family": "olmo2", "attention_bias": True},
        {"family": "qwen3", "moe": {"num_experts": 4, "top_k": 2, "normalize_weights": True}},
        {"family": "mistral", "moe": {"num_experts": 4, "top_k": 2, "normalize_weights": True}},
    ],
    ids=lambda o: o["family"] + ("-moe" if "moe" in o else ""),
)
def test_what_export_hf_writes_is_read_back_with_no_field_reported(tmp_path, options):
    """Forge's own export is a checkpoint like any other: every key transformers saves
    in its config.json is read or ignored with its reason."""
    pytest.importorskip("transformers")
    import cattrs

    from forge_plugins.models.hf_interop import hf_config
    from forge_plugins.models.options import LlamaOptions

    shapes = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64}
    opts = cattrs.structure({**shapes, **options}, LlamaOptions)
    hf_config(opts, 260, bos_token_id=1, eos_token_id=2).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    values, problems = options_from_hf_config(config)
    assert values and not problems, (sorted(config), problems)
