"""Hugging Face interop for every family (llama, qwen2, qwen3, mistral, olmo2, and Llama's
rope scalings): a tiny random checkpoint written locally by transformers initialises a
Forge model with no shape typed, with transformers' logits; an exported folder loads in
transformers with Forge's logits; sharded checkpoints, pipeline parts and meta-device
construction load only what they hold.

Tolerances. In float64 the comparison is an identity proof, with one adjustment:
transformers' RMSNorm computes in float32 whatever the model's dtype (it casts to
float32 and back), so a float64 transformers model still rounds every norm to float32.
:func:`float64_norms` gives it the same formula in float64; both libraries then compute
in float64 throughout, except the rotary cos/sin tables, which both build the same way in
float32 (transformers' choice, mirrored by Forge so that imported checkpoints see the
same table). The tolerance is then float64 rounding of the model's longest sum. The
float32 checks (transformers unmodified) use float32 rounding of the same size.
"""

from __future__ import annotations

import json

import pytest
import torch

from forge_core.distributed.parallelize import is_meta, materialize
from forge_core.testing import assert_within_rounding, longest_sum, packed_metadata
from forge_core.testing.isolation import check_document_isolation
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models import hf_interop, hf_keys
from forge_plugins.models.hf_config import check_hf_compatible
from forge_plugins.models.llama import build
from forge_plugins.models.options import LlamaOptions, RopeScaling

transformers = pytest.importorskip("transformers")

VOCAB = 67
SHAPES = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_theta=500.0,
    initializer_range=0.2,
)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
#: One checkpoint per family and per rope scaling Forge implements, each with what sets
#: it apart (biases, per-head norms, a head width other than dim / n_heads, ties).
CHECKPOINTS = {
    "llama": ("llama", {}),
    "llama-bias-llama3": ("llama", {"attention_bias": True, "mlp_bias": True, "rope_scaling": LLAMA3}),
    "llama-yarn": (
        "llama",
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}},
    ),
    "llama-linear-tied": (
        "llama",
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "tie_word_embeddings": True},
    ),
    "llama-dynamic": ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "mistral": ("mistral", {"sliding_window": 64}),
    # Post-norm blocks and q/k norms over the whole projection (4 heads of 8: widths 32, 16).
    "olmo2": ("olmo2", {}),
}
ARCH = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
}


def perturb(model) -> None:
    """Norm weights start at ones and biases at zeros in both libraries; make them
    distinct so that a wrong mapping cannot go unnoticed."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.uniform_(0.5, 1.5)


def random_hf(path, family: str = "llama", vocab: int = VOCAB, **config):
    """A random transformers model of ``family`` saved to ``path`` (float32)."""
    hf_config = transformers.AutoConfig.for_model(family, vocab_size=vocab, **{**SHAPES, **config})
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa").eval()
    perturb(model)
    model.save_pretrained(path)
    return model


def float64_norms(model) -> None:
    """transformers' RMSNorm with its float32 round trip removed (module docstring)."""

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = forward.__get__(module)


def forge_from(path, vocab: int = VOCAB, backend=None, **options):
    model = build(
        LlamaOptions(init_from_hf=str(path), **options), vocab, backend or SdpaAttention(SdpaOptions())
    )
    materialize(model, "cpu")
    return model.eval()


def tokens(seq=24, vocab=VOCAB):
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(3))


def same_logits(actual, expected, model, dtype=torch.float32, what="Forge logits against transformers'"):
    assert_within_rounding(
        actual, expected, dtype=dtype, terms=longest_sum(model, actual.shape[1]), what=what
    )


@pytest.mark.numerical
@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_a_checkpoint_imports_with_no_shape_typed_and_transformers_logits(tmp_path, name):
    family, extra = CHECKPOINTS[name]
    random_hf(tmp_path, family, **extra)
    model = forge_from(tmp_path)
    assert model.options.family == family and model.options.dim == 32 and model.options.n_layers == 2
    with torch.no_grad():
        ids = tokens()
        forge32 = model(ids)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
        same_logits(forge32, hf(ids).logits, model, what=f"{name}: float32")
        hf64 = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, dtype=torch.float64, attn_implementation="sdpa", trust_remote_code=False
        ).eval()
        float64_norms(hf64)
        same_logits(model.double()(ids), hf64(ids).logits, model, torch.float64, f"{name}: float64")


@pytest.mark.parametrize(
    "name", ["llama-bias-llama3", "qwen2-tied", "qwen3", "mistral", "llama-yarn", "olmo2"]
)
def test_an_exported_model_loads_as_its_family_in_transformers_with_equal_logits(tmp_path, name):
    family, extra = CHECKPOINTS[name]
    random_hf(tmp_path / "in", family, **extra)
    model = forge_from(tmp_path / "in")
    # A compiled/DDP-wrapped model's keys carry prefixes; export strips them.
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    hf_interop.export(state, model.options, tmp_path / "out", eos_token_id=2)
    config = json.loads((tmp_path / "out/config.json").read_text())
    assert config["architectures"] == [ARCH[family]] and config["model_type"] == family
    assert json.loads((tmp_path / "out/generation_config.json").read_text())["eos_token_id"] == 2
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=False).eval()
    assert type(hf).__name__ == ARCH[family]
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)


@pytest.mark.parametrize("tie", [False, True])
def test_a_random_forge_model_exports_as_a_llama(tmp_path, tie):
    opts = LlamaOptions(
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=64,
        init_std=0.2,
        norm_eps=1e-6,
        rope_theta=500.0,
        tie_embeddings=tie,
    )
    torch.manual_seed(0)
    model = build(opts, VOCAB, SdpaAttention(SdpaOptions()))
    perturb(model)
    hf_interop.export(model.state_dict(), opts, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is tie
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
    assert hf.dtype == torch.float32
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)


def test_explicit_options_that_agree_are_kept_and_a_smaller_tokenizer_fits(tmp_path):
    hf = random_hf(tmp_path, tie_word_embeddings=True)
    # The tokenizer may be smaller than the checkpoint's (padded) vocabulary.
    model = forge_from(tmp_path, vocab=VOCAB - 3, dim=32, ffn_hidden=48, tie_embeddings=True)
    assert model.output.weight.shape[0] == VOCAB and model.output.weight is model.tok_embeddings.weight
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)


def test_hf_initialised_model_matches_each_document_when_packed(tmp_path):
    # Continuing pretraining with packing: packed rows give the HF model's per-document logits.
    hf = random_hf(tmp_path, "qwen3", head_dim=16)
    model = forge_from(tmp_path)
    doc_ids, positions = packed_metadata([(6, 10)])
    row = tokens(16)[:1]
    with torch.no_grad():
        packed = model(row, doc_ids=doc_ids, positions=positions)
        second = hf(row[:, 6:]).logits
    same_logits(packed[:, 6:], second, model, what="packed second document against transformers on it alone")


@pytest.fixture
def unfused_flex(monkeypatch):
    """FlexAttention on PyTorch's unfused flex_attention: the same BlockMask semantics
    as the compiled kernel, in float64 and without a compilation."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    from forge_plugins.attention import flex_kernel
    from forge_plugins.attention.flex import FlexAttention
    from forge_plugins.attention.options import FlexOptions

    monkeypatch.setattr(flex_kernel, "compiled", flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield FlexAttention(FlexOptions(block_size=16))


@pytest.mark.numerical
@pytest.mark.parametrize("backend", ["eager", "flex"])
@pytest.mark.parametrize("name", ["qwen2-tied", "qwen3", "llama-bias-llama3", "olmo2"])
def test_every_attention_backend_runs_an_imported_family(tmp_path, backend, name, unfused_flex):
    """Float64 identity with transformers through the eager and FlexAttention backends
    (sdpa: above), and packed documents isolated through the whole imported model (the
    attention kit's model check, with this model in place of its tiny llama)."""
    from forge_core.api import NoOptions
    from forge_plugins.attention.eager import EagerAttention

    family, extra = CHECKPOINTS[name]
    random_hf(tmp_path, family, **extra)
    attention = {"eager": EagerAttention(NoOptions()), "flex": unfused_flex}[backend]
    model = forge_from(tmp_path, backend=attention).double()
    hf64 = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float64, attn_implementation="sdpa", trust_remote_code=False
    ).eval()
    float64_norms(hf64)  # and sdpa: transformers' eager attention takes its softmax in float32
    with torch.no_grad():
        same_logits(model(tokens()), hf64(tokens()).logits, model, torch.float64, f"{name} through {backend}")
    worst = check_document_isolation(
        model, rows=((5, 1, 11, 7), (24,)), standalone="prefix", dtypes=(torch.float64,)
    )
    assert max(worst.values()) < 1


def test_the_model_is_built_on_the_meta_device_and_loaded_when_materialised(tmp_path):
    hf = random_hf(tmp_path, tie_word_embeddings=True)
    model = build(LlamaOptions(init_from_hf=str(tmp_path)), VOCAB, SdpaAttention(SdpaOptions()))
    assert is_meta(model)
    materialize(model, "cpu")
    assert not is_meta(model) and model.output.weight is model.tok_embeddings.weight
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)


def test_a_sharded_checkpoint_loads_file_by_file(tmp_path):
    hf = random_hf(tmp_path / "one")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded/model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 2
    model = forge_from(tmp_path / "sharded")
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)


def test_a_pipeline_part_loads_only_its_own_layers(tmp_path):
    random_hf(tmp_path)
    full = forge_from(tmp_path)
    with torch.device("meta"):
        part = build(LlamaOptions(init_from_hf=str(tmp_path)), VOCAB, SdpaAttention(SdpaOptions()))
    del part.layers["0"]
    part.tok_embeddings = None
    materialize(part, "cpu")
    assert torch.equal(part.layers["1"].attention.wq.weight, full.layers["1"].attention.wq.weight)
    assert torch.equal(part.output.weight, full.output.weight)


def test_mismatched_explicit_options_list_every_difference_with_both_values(tmp_path):
    random_hf(tmp_path, tie_word_embeddings=True)
    with pytest.raises(ValueError) as info:
        build(
            LlamaOptions(dim=64, norm_eps=1e-5, tie_embeddings=False, init_from_hf=str(tmp_path)),
            VOCAB,
            SdpaAttention(SdpaOptions()),
        )
    message = str(info.value)
    assert "model.options.dim=64 but config.json hidden_size=32: remove dim from model.options" in message
    assert "model.options.norm_eps=1e-05 but config.json rms_norm_eps=1e-06" in message
    assert "model.options.tie_embeddings=False but config.json tie_word_embeddings=True" in message


def test_a_tokenizer_larger_than_the_checkpoint_vocab_is_refused(tmp_path):
    random_hf(tmp_path)
    with pytest.raises(ValueError, match=f"tokenizer has {VOCAB + 1} tokens"):
        build(LlamaOptions(init_from_hf=str(tmp_path)), VOCAB + 1, SdpaAttention(SdpaOptions()))


def test_rope_scaling_is_read_from_either_config_format(tmp_path):
    random_hf(tmp_path, rope_scaling=LLAMA3)
    config = json.loads((tmp_path / "config.json").read_text())
    params = config.pop("rope_parameters")
    # transformers before 5 wrote rope_theta and rope_scaling (with "type" in older files).
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = {"type": params.pop("rope_type"), **params}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = forge_from(tmp_path)
    assert model.options.rope_theta == 500.0
    assert model.options.rope_scaling == RopeScaling(
        type="llama3", factor=8.0, original_max_position_embeddings=16
    )
    assert check_hf_compatible(model.options, tmp_path) == VOCAB


def test_key_mapping_round_trips_for_every_parameter_of_every_family(tmp_path):
    for family, extra in (
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("qwen2", {}),
        ("qwen3", {}),
        ("olmo2", {"attention_bias": True}),
    ):
        model = build(
            LlamaOptions(family=family, dim=32, n_layers=1, n_heads=4, **extra),
            VOCAB,
            SdpaAttention(SdpaOptions()),
        )
        shapes = hf_keys.forge_shapes(model.options, VOCAB)
        assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == shapes
        for key in shapes:
            assert hf_keys.from_hf_key(hf_keys.to_hf_key(key), post_norm=family == "olmo2") == key
    assert hf_keys.from_hf_key("model.layers.0.self_attn.rotary_emb.inv_freq") is None


def test_export_refuses_a_partial_state_dict(tmp_path):
    opts = LlamaOptions(dim=32, n_layers=2, n_heads=4)
    state = build(opts, VOCAB, SdpaAttention(SdpaOptions())).state_dict()
    del state["layers.1.feed_forward.w2.weight"]
    with pytest.raises(ValueError, match="missing"):
        hf_interop.export(state, opts, tmp_path)


def test_weights_are_written_in_shards_with_an_index(tmp_path):
    tensors = {f"t{i}": torch.zeros(256) for i in range(5)}  # 1 KiB each
    files = hf_interop.write_weights(tensors, tmp_path, max_shard_size=2500)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert [f.name for f in files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert index["metadata"]["total_size"] == 5 * 1024
    assert index["weight_map"] == {
        "t0": files[0].name,
        "t1": files[0].name,
        "t2": files[1].name,
        "t3": files[1].name,
        "t4": files[2].name,
    }


def test_a_null_sliding_window_reads_as_no_window_and_exports_as_null(tmp_path):
    """Mistral's class default is a 4096 window, but ``sliding_window: null`` is none:
    the model covers all 8192 positions, and the export writes the null back."""
    random_hf(tmp_path / "in", "mistral", sliding_window=None, max_position_embeddings=8192)
    assert json.loads((tmp_path / "in/config.json").read_text())["sliding_window"] is None
    model = forge_from(tmp_path / "in")
    assert model.options.sliding_window == 0 and model.options.max_seq_len == 8192
    hf_interop.export(model.state_dict(), model.options, tmp_path / "out")
    config = json.loads((tmp_path / "out/config.json").read_text())
    assert config["sliding_window"] is None and config["max_position_embeddings"] == 8192
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=False).eval()
    assert hf.config.sliding_window is None
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)
