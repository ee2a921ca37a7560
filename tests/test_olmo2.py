"""OLMo 2 beyond what :mod:`test_hf_interop` checks for every family (logits both ways
in float32 and float64, export, the eager and flex backends): a Hub id from the offline
cache, packed documents equal to each document alone, the control that shows the
whole-projection q/k norm matters, and the tensor-parallel plan the q/k norms need (its
training equals one process in tests/distributed/test_parallel_equivalence.py, tp_olmo2).

Bounds. In float32 on the CPU Forge runs the same kernels in the same order as
transformers' ``Olmo2ForCausalLM`` (sdpa, the same RMSNorm formula with the weight
applied before the cast back, the same rotary table): the logits are asserted bitwise
equal once. Where the two compute differently (a packed row's masked attention against
a document alone, the Hub-id load checked as every family is) the assertions take the
float32 rounding of the model's longest sum
(:func:`~forge_core.testing.assert_within_rounding`); the control moves the logits by
far more than that bound."""

from __future__ import annotations

import json

import pytest
import torch
from hub_cache import put

from forge_core import cli
from forge_core.distributed.parallelize import materialize
from forge_core.testing import assert_within_rounding, longest_sum, packed_metadata
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models.llama import build
from forge_plugins.models.options import LlamaOptions

transformers = pytest.importorskip("transformers")

VOCAB = 67
ID = "allenai/tiny-olmo2"


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory):
    """A random transformers Olmo2ForCausalLM (4 query heads, 2 key/value heads of 8
    channels: q/k norms of 32 and 16) saved to a folder, its norms away from ones."""
    path = tmp_path_factory.mktemp("olmo2")
    config = transformers.AutoConfig.for_model(
        "olmo2",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        initializer_range=0.2,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return path, model


def forge_from(source: str) -> torch.nn.Module:
    model = build(LlamaOptions(init_from_hf=source), VOCAB, SdpaAttention(SdpaOptions()))
    materialize(model, "cpu")
    return model.eval()


def tokens(seq=24):
    return torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(3))


def same_logits(actual, expected, model, what):
    return assert_within_rounding(
        actual, expected, dtype=torch.float32, terms=longest_sum(model, actual.shape[1]), what=what
    )


@pytest.mark.numerical
def test_a_hub_id_from_the_offline_cache_loads_with_transformers_logits(olmo2, tmp_path, monkeypatch):
    folder, hf = olmo2
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    put(tmp_path / "hub", ID, folder)
    model = forge_from(ID)
    options = model.options
    assert (options.family, options.n_heads, options.n_kv_heads, options.norm_eps) == ("olmo2", 4, 2, 1e-6)
    block = model.layers["0"]
    assert block.attention_norm is None and block.ffn_norm is None
    assert block.attention.q_norm.weight.shape == (32,) and block.attention.k_norm.weight.shape == (16,)
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model, "olmo2 by Hub id against transformers")


@pytest.mark.numerical
def test_float32_logits_are_bitwise_transformers_on_the_cpu(olmo2):
    """The bound where the kernels are the same: on the CPU both run the same float32
    operations in the same order (projections, the norm's formula with the weight
    before the cast, the rotary table, causal sdpa), so the logits are equal bit for
    bit (measured with ATEN_CPU_CAPABILITY avx512 and default)."""
    folder, hf = olmo2
    model = forge_from(str(folder))
    with torch.no_grad():
        ours, theirs = model(tokens()), hf(tokens()).logits
    assert torch.equal(ours, theirs), f"largest difference {(ours - theirs).abs().max().item():.3g}"


@pytest.mark.numerical
def test_packed_documents_equal_each_document_alone(olmo2):
    folder, hf = olmo2
    model = forge_from(str(folder))
    doc_ids, positions = packed_metadata([(6, 10)])
    row = tokens(16)[:1]
    with torch.no_grad():
        packed = model(row, doc_ids=doc_ids, positions=positions)
        for start, end in ((0, 6), (6, 16)):
            alone = hf(row[:, start:end]).logits
            same_logits(packed[:, start:end], alone, model, f"packed document [{start}, {end}) alone")


def per_head(norm, head_dim):
    """``norm`` (whole projection) replaced by the per-head RMSNorm with the same weight:
    each head's channels normalised on their own (what qwen3 does)."""

    def forward(x):
        heads = x.view(*x.shape[:-1], -1, head_dim)
        normed = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + norm.eps)
        return norm.weight * normed.flatten(-2)

    norm.forward = forward


@pytest.mark.numerical
def test_a_per_head_qk_norm_in_place_of_the_whole_projection_moves_the_logits(olmo2):
    """The control: the same weights with q/k normalised per head give logits far outside
    the bound the real model meets, so the equality above depends on the whole-projection
    norm."""
    folder, hf = olmo2
    model = forge_from(str(folder))
    with torch.no_grad():
        expected = hf(tokens()).logits
        same_logits(model(tokens()), expected, model, "olmo2")
        for layer in model.layers.values():
            per_head(layer.attention.q_norm, 8)
            per_head(layer.attention.k_norm, 8)
        moved = model(tokens())
    with pytest.raises(AssertionError):
        same_logits(moved, expected, model, "olmo2 with per-head q/k norms")
    assert (moved - expected).abs().max() > 1e-2


def test_the_tensor_parallel_plan_shards_the_qk_norms_with_their_heads(olmo2, tmp_path, capsys):
    """The q/k norms span every head, which tp splits: their weights are sharded as the
    projections' outputs are (their sums of squares all-reduced), not declared partial
    as qwen3's per-head ones; the post-norms run on the replicated residual stream."""
    from forge_plugins.models.llama_parallel import ProjectionNormParallel

    folder, _ = olmo2
    plan = forge_from(str(folder)).parallel_contract().tensor_parallel(sequence_parallel=False)
    styles = plan.block.styles
    assert isinstance(styles["attention.q_norm"], ProjectionNormParallel)
    assert isinstance(styles["attention.k_norm"], ProjectionNormParallel)
    assert not plan.block.partial
    assert set(plan.block.replicated) == {"post_attention_norm", "post_ffn_norm"}
    data = {
        "run": {"out_dir": str(tmp_path / "run")},
        "model": {"name": "llama", "options": {"init_from_hf": str(folder), "max_seq_len": 32}},
        "data": {"source": "stdlib", "tokenizer": "byte", "packer": "concat", "seq_len": 32},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(data))
    code = cli.main(["check", str(path), "--world-size", "2", "parallel.tp=2"])
    out = capsys.readouterr().out
    assert code == 0, out


@pytest.mark.numerical
def test_decoding_with_the_cache_equals_the_whole_forward(olmo2):
    """Sampling's path: the q/k norms run on each new token's projections before the
    cache stores its keys, as in the whole forward."""
    folder, _ = olmo2
    model = forge_from(str(folder)).double()
    ids = tokens(12)
    with torch.no_grad():
        whole = model(ids)
        cache = model.new_cache(2, 12)
        steps = [model(ids[:, :5], cache=cache)] + [
            model(ids[:, i : i + 1], cache=cache) for i in range(5, 12)
        ]
    assert_within_rounding(
        torch.cat(steps, dim=1),
        whole,
        dtype=torch.float64,
        terms=longest_sum(model, 12),
        what="cached decode",
    )


def test_the_norms_apply_their_weight_before_the_cast_back_as_olmo2_does():
    """In bf16 transformers' Olmo2RMSNorm multiplies by the weight in fp32 and casts
    once; Forge's olmo2 norms do the same, bit for bit, where the llama order (cast,
    then multiply in bf16) rounds twice and differs."""
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    from forge_plugins.models.llama import RMSNorm

    x = torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weight = torch.rand(32, generator=torch.Generator().manual_seed(1)).add(0.5).to(torch.bfloat16)
    theirs, ours, llama = Olmo2RMSNorm(32, 1e-6), RMSNorm(32, 1e-6, True), RMSNorm(32, 1e-6)
    for norm in (theirs, ours, llama):
        norm.to(torch.bfloat16).weight.data.copy_(weight)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        assert not torch.equal(llama(x), theirs(x))  # the control: the order shows in bf16
