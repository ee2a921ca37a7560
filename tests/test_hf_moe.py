"""Hugging Face interop for mixture-of-experts models: tiny random Qwen3-MoE and Mixtral
checkpoints written by transformers initialise a Forge model with no shape typed and
transformers' logits; an exported Forge MoE model loads in transformers as its
architecture with Forge's logits; the names of every expert round-trip; what a
checkpoint cannot express is refused with its reason.

Tolerances as in ``tests/test_hf_interop.py``: float32 rounding of the longest sum in
float32, float64 rounding in float64, where transformers' float32 steps (the RMSNorm's
round trip, and here the router's softmax, which it takes in float32 whatever the
model's dtype) get the same formula in float64 (:func:`float64_router`).
"""

from __future__ import annotations

import json

import attrs
import pytest
import torch
from test_hf_interop import VOCAB, float64_norms, forge_from, perturb, same_logits, tokens

from forge_core.api import ForgeError
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models import hf_interop, hf_keys
from forge_plugins.models.hf_config import hf_folder_problems
from forge_plugins.models.hf_folder import checkpoint_shapes
from forge_plugins.models.llama import build
from forge_plugins.models.options import LlamaOptions, MoEOptions

transformers = pytest.importorskip("transformers")

SHAPES = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_theta=500.0,
    initializer_range=0.2,
    num_experts_per_tok=2,
)
#: Qwen3-MoE with a dense layer among sparse ones, renormalised or not; Mixtral.
CHECKPOINTS = {
    "qwen3_moe": (
        "qwen3_moe",
        {"num_experts": 4, "moe_intermediate_size": 24, "mlp_only_layers": [1], "head_dim": 16},
    ),
    "qwen3_moe-norm-step2": (
        "qwen3_moe",
        {"num_experts": 5, "moe_intermediate_size": 16, "decoder_sparse_step": 2, "norm_topk_prob": True},
    ),
    "mixtral": ("mixtral", {"num_local_experts": 4, "sliding_window": 64}),
}
ARCH = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}


def random_hf(path, model_type: str, **config):
    """A random transformers MoE model saved to ``path`` (float32)."""
    hf_config = transformers.AutoConfig.for_model(model_type, vocab_size=VOCAB, **{**SHAPES, **config})
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa").eval()
    perturb(model)
    model.save_pretrained(path)
    return model


def float64_router(model) -> None:
    """transformers' routers with the softmax in the model's dtype (they take it in
    float32 whatever the dtype; Forge's router keeps float64 in float64)."""

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(hidden_states, self.weight)
        top, indices = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
        if getattr(self, "norm_topk_prob", True):
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, indices

    for module in model.modules():
        if type(module).__name__.endswith("TopKRouter"):
            module.forward = forward.__get__(module)


def hf64(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.float64,
        attn_implementation="sdpa",
        experts_implementation="eager",  # its grouped_mm has no float64 kernel
        trust_remote_code=False,
    ).eval()
    float64_norms(model)
    float64_router(model)
    return model


@pytest.mark.numerical
@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_a_moe_checkpoint_imports_with_no_shape_typed_and_transformers_logits(tmp_path, name):
    model_type, extra = CHECKPOINTS[name]
    random_hf(tmp_path, model_type, **extra)
    model = forge_from(tmp_path)
    moe = model.options.moe
    assert model.options.family == {"qwen3_moe": "qwen3", "mixtral": "mistral"}[model_type]
    assert moe.router == "softmax" and moe.top_k == 2
    if name == "qwen3_moe":
        assert (moe.num_experts, moe.expert_hidden, moe.layers, moe.normalize_weights) == (
            4,
            24,
            [0, 2],
            False,
        )
        assert hasattr(model.layers["1"].feed_forward, "w1") and model.options.ffn_hidden == 48
    elif name == "mixtral":
        assert (moe.num_experts, moe.expert_hidden, moe.every, moe.normalize_weights) == (4, 48, 1, True)
    else:
        assert (moe.every, moe.layers, moe.normalize_weights) == (2, None, True)
    with torch.no_grad():
        ids = tokens()
        forge32 = model(ids)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
        same_logits(forge32, hf(ids).logits, model, what=f"{name}: float32")
        same_logits(model.double()(ids), hf64(tmp_path)(ids).logits, model, torch.float64, f"{name}: float64")


def test_the_expert_names_are_those_transformers_saves_and_round_trip(tmp_path):
    """Every Hugging Face name Forge expects of a MoE checkpoint is one save_pretrained
    wrote, with its shape, and none is left over; each maps back to its Forge key."""
    for name, (model_type, extra) in CHECKPOINTS.items():
        random_hf(tmp_path / name, model_type, **extra)
        model = forge_from(tmp_path / name)
        expected = hf_keys.expected_hf_shapes(model.options, VOCAB)
        assert expected == checkpoint_shapes(tmp_path / name), name
        kind = {"qwen3_moe": "qwen3_moe", "mixtral": "mixtral"}[model_type]
        state = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith("expert_bias")}
        assert state == hf_keys.forge_shapes(model.options, VOCAB)
        assert {hf_keys.from_hf_key(key, kind) for key in expected} == set(state)


def test_experts_load_into_a_stack_that_holds_some_of_them(tmp_path):
    """Expert parallelism leaves each process a contiguous block of each stack
    (``first_expert``): it reads exactly those experts' matrices."""
    model_type, extra = CHECKPOINTS["mixtral"]
    random_hf(tmp_path, model_type, **extra)
    full = forge_from(tmp_path)
    with torch.device("meta"):
        part = build(LlamaOptions(init_from_hf=str(tmp_path)), VOCAB, SdpaAttention(SdpaOptions()))
    for layer in part.layers.values():
        experts = layer.feed_forward.experts
        experts.first_expert, experts.local_experts = 1, 2
        for name in ("w1", "w2", "w3"):
            setattr(experts, name, torch.nn.Parameter(getattr(experts, name)[1:3]))
    from forge_core.distributed.parallelize import materialize

    materialize(part, "cpu")
    for key in ("w1", "w2", "w3"):
        got = part.layers["2"].feed_forward.experts.get_parameter(key)
        assert torch.equal(got, full.layers["2"].feed_forward.experts.get_parameter(key)[1:3])


def forge_moe(family="llama", n_layers=2, **moe):
    opts = LlamaOptions(
        family=family,
        dim=32,
        n_layers=n_layers,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=64,
        init_std=0.2,
        norm_eps=1e-6,
        rope_theta=500.0,
        moe=MoEOptions(**{"num_experts": 4, "top_k": 2, "expert_hidden": 16, **moe}),
    )
    torch.manual_seed(0)
    model = build(opts, VOCAB, SdpaAttention(SdpaOptions()))
    perturb(model)
    return model.eval()


@pytest.mark.parametrize(
    ("family", "moe", "arch", "fields"),
    [
        (
            "llama",
            {"normalize_weights": True, "capacity_factor": 1.0},  # training only: eval is dropless
            "MixtralForCausalLM",
            {"num_local_experts": 4, "intermediate_size": 16},
        ),
        (
            "qwen3",
            {"every": 2},
            "Qwen3MoeForCausalLM",
            {"decoder_sparse_step": 2, "mlp_only_layers": [], "norm_topk_prob": False},
        ),
        (
            "qwen3",
            {"layers": [0, 2], "normalize_weights": True},
            "Qwen3MoeForCausalLM",
            {"decoder_sparse_step": 1, "mlp_only_layers": [1], "moe_intermediate_size": 16},
        ),
    ],
)
def test_a_random_forge_moe_model_exports_as_its_architecture(tmp_path, family, moe, arch, fields):
    model = forge_moe(family, n_layers=3, **moe)
    # A compiled/DDP-wrapped model's keys carry prefixes; export strips them.
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    hf_interop.export(state, model.options, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [arch]
    assert {k: config[k] for k in fields} == fields
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
    assert type(hf).__name__ == arch
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)
    # And the export imports as the same model (the training-only capacity aside).
    back = forge_from(tmp_path)
    assert back.options.moe == attrs.evolve(model.options.moe, capacity_factor=0.0)
    assert back.options.family == ("mistral" if family == "llama" else family)


@pytest.mark.parametrize(
    ("family", "moe", "message"),
    [
        ("qwen3", {"shared_experts": 1}, "shared_experts=1: Qwen3MoeForCausalLM has no shared experts"),
        ("qwen3", {"router": "sigmoid", "normalize_weights": True}, "router='sigmoid'"),
        ("qwen3", {"route_scale": 2.5}, "route_scale=2.5"),
        ("mistral", {"every": 2, "normalize_weights": True}, "leaves blocks [0] dense"),
        ("mistral", {}, "normalize_weights=false: MixtralForCausalLM always renormalises"),
        ("qwen2", {}, "model.options.family='qwen2' with experts"),
    ],
)
def test_export_refuses_what_the_architecture_cannot_compute(tmp_path, family, moe, message):
    model = forge_moe(family, **moe)
    with pytest.raises(ForgeError, match="no Hugging Face architecture") as info:
        hf_interop.export(model.state_dict(), model.options, tmp_path / "out")
    assert message in str(info.value)
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_router_with_a_selection_bias(tmp_path):
    model = forge_moe("mistral", normalize_weights=True)
    hf_interop.export(model.state_dict(), model.options, tmp_path / "zero")  # zeros: exports
    with torch.no_grad():
        model.layers["1"].feed_forward.router.expert_bias[2] = 0.25
    with pytest.raises(ForgeError, match="layers.1.feed_forward.router.expert_bias"):
        hf_interop.export(model.state_dict(), model.options, tmp_path / "biased")


def edited(tmp_path, name, nulls=(), **changes):
    """A checkpoint of ``CHECKPOINTS[name]`` with ``config.json`` changed (``None``
    removes a key, ``nulls`` are set to null)."""
    model_type, extra = CHECKPOINTS[name]
    random_hf(tmp_path, model_type, **extra)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        config.pop(key, None) if value is None else config.__setitem__(key, value)
    config.update(dict.fromkeys(nulls))
    path.write_text(json.dumps(config))
    return tmp_path


def test_the_older_num_experts_spelling_is_read(tmp_path):
    hf = edited(tmp_path, "qwen3_moe", num_local_experts=None, num_experts=4)
    assert hf_folder_problems(LlamaOptions(), hf) == []
    assert forge_from(hf).options.moe.num_experts == 4


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_experts_per_tok": 5}, "num_experts_per_tok=5 is more than the 4 experts"),
        ({"num_experts": 6}, "config.json num_experts=6 and num_local_experts=4 name the same expert count"),
        ({"mlp_only_layers": [1, "2"]}, "mlp_only_layers=[1, '2'] must be null or a list of layer indices"),
        ({"moe_intermediate_size": 0}, "moe_intermediate_size=0 must be"),
        ({"decoder_sparse_step": 1.5}, "decoder_sparse_step=1.5 is not an integer"),
        ({"nulls": ["norm_topk_prob"]}, "config.json norm_topk_prob is null, which transformers cannot load"),
        ({"nulls": ["num_experts_per_tok"]}, "num_experts_per_tok is null"),
    ],
)
def test_a_bad_moe_config_json_is_named_field_by_field(tmp_path, changes, message):
    problems = hf_folder_problems(LlamaOptions(), edited(tmp_path, "qwen3_moe", **changes))
    assert any(message in p for p in problems), problems


def test_mixtral_router_noise_is_refused(tmp_path):
    problems = hf_folder_problems(LlamaOptions(), edited(tmp_path, "mixtral", router_jitter_noise=0.1))
    assert problems == [
        "router_jitter_noise=0.1: Forge's router multiplies no noise into its input in training; "
        "set it to 0 in config.json to train without it"
    ]


def test_moe_options_that_differ_from_the_checkpoint_are_listed_with_both_values(tmp_path):
    hf = edited(tmp_path, "qwen3_moe")
    # Left at their defaults, the routing options are the checkpoint's; the training ones stay.
    given = LlamaOptions(init_from_hf=str(hf), moe=MoEOptions(aux_loss=0.01, capacity_factor=1.5))
    assert hf_folder_problems(given, hf) == []
    model = build(given, VOCAB, SdpaAttention(SdpaOptions()))
    assert model.options.moe == MoEOptions(
        num_experts=4, top_k=2, expert_hidden=24, layers=[0, 2], aux_loss=0.01, capacity_factor=1.5
    )
    problems = hf_folder_problems(LlamaOptions(moe=MoEOptions(top_k=3, expert_hidden=32)), hf)
    assert problems == [
        "model.options.moe.top_k=3 but config.json num_experts_per_tok=2: leave moe.top_k at its default "
        "to take the checkpoint's value, or point init_from_hf at a checkpoint with top_k=3",
        "model.options.moe.expert_hidden=32 but config.json moe_intermediate_size=24: leave "
        "moe.expert_hidden at its default to take the checkpoint's value, or point init_from_hf at a "
        "checkpoint with expert_hidden=32",
    ]
    problems = hf_folder_problems(LlamaOptions(moe=MoEOptions(shared_experts=1)), hf)
    assert problems[0].startswith(
        "model.options.moe.shared_experts=1 but every Qwen3MoeForCausalLM has shared_experts=0"
    )
    # Mixtral has no field for the layers: every block is sparse.
    problems = hf_folder_problems(LlamaOptions(moe=MoEOptions(every=2)), edited(tmp_path / "m", "mixtral"))
    assert problems[0].startswith("model.options.moe.every=2 but every MixtralForCausalLM has every=1:")


def test_a_dense_checkpoint_refuses_an_moe_block(tmp_path):
    from test_hf_interop import random_hf as random_dense

    random_dense(tmp_path, "qwen3", head_dim=16)
    problems = hf_folder_problems(LlamaOptions(moe=MoEOptions()), tmp_path)
    assert problems == [
        "model.options.moe is set but config.json model_type='qwen3' is a dense checkpoint (no experts "
        "to load); remove moe from model.options, or point init_from_hf at a Qwen3-MoE or Mixtral checkpoint"
    ]


def test_a_missing_or_misshapen_expert_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = edited(tmp_path, "mixtral")
    tensors = load_file(hf / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    tensors["model.layers.0.block_sparse_moe.experts.0.w1.weight"] = torch.zeros(48, 31)
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    problems = hf_folder_problems(LlamaOptions(), hf)
    assert problems == [
        "weights missing for 1 tensors: model.layers.1.block_sparse_moe.experts.3.w2.weight",
        "model.layers.0.block_sparse_moe.experts.0.w1.weight has shape [48, 31], the options need [48, 32]",
    ]


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_a_moe_checkpoint_trains_and_exports_back_to_its_architecture(tmp_path, name):
    """init_from_hf alone (no shape, no moe block typed), a few training steps through
    the CLI, export-hf: transformers loads the export as the checkpoint's architecture
    with the trained model's logits."""
    from train_helpers import read_metrics, tiny_config, write_config

    from forge_core import cli
    from forge_core.generate import load_for_inference
    from forge_core.testing import assert_within_rounding, longest_sum

    model_type, extra = CHECKPOINTS[name]
    # 260 tokens: the byte tokenizer's 258, padded.
    hf_config = transformers.AutoConfig.for_model(model_type, **{**SHAPES, **extra, "vocab_size": 260})
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(hf_config).save_pretrained(tmp_path / "hf-in")
    config = tiny_config(tmp_path, "run", train={"steps": 3}, logging={"loggers": ["jsonl"]})
    config["model"]["options"] = {"init_from_hf": str(tmp_path / "hf-in")}
    assert cli.main([write_config(tmp_path / "run.yaml", config)]) == 0
    losses = [r["loss"] for r in read_metrics(tmp_path / "run")]
    assert len(losses) == 3 and all(loss == loss and loss < 10 for loss in losses)
    model, tokenizer, run_config, _ = load_for_inference(tmp_path / "run")
    assert run_config.model.options.moe.num_experts == hf_config.num_local_experts
    before = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf-in")
    # transformers names the router mlp.gate in memory for both (Mixtral's on disk: block_sparse_moe).
    trained = model.layers["2"].feed_forward.router.gate.weight
    assert not torch.equal(trained, before.state_dict()["model.layers.2.mlp.gate.weight"])
    assert cli.main(["export-hf", str(tmp_path / "run"), str(tmp_path / "hf-out")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "hf-out", trust_remote_code=False
    ).eval()
    assert type(hf).__name__ == ARCH[model_type]
    ids = torch.tensor([tokenizer.encode("the lazy dog jumps over")])
    with torch.no_grad():
        assert_within_rounding(
            hf(ids).logits,
            model(ids),
            dtype=torch.float32,
            terms=longest_sum(model, ids.shape[1]),
            what="the exported model's logits in transformers",
        )
