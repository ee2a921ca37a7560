"""Hugging Face interop: an exported folder loads in transformers with equal logits, and a
(small, random) transformers Llama initialises a Forge model with equal logits (equal
within float32 rounding of the logits' size: the two libraries sum in different orders)."""

from __future__ import annotations

import json

import pytest
import torch

from forge_core.testing import assert_within_rounding, longest_sum
from forge_plugins.attention.options import SdpaOptions
from forge_core.testing import packed_metadata
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models import hf_interop
from forge_plugins.models.llama import build
from forge_plugins.models.options import LlamaOptions

transformers = pytest.importorskip("transformers")

VOCAB = 67


def options(**overrides) -> LlamaOptions:
    base = dict(
        dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, init_std=0.2,
        norm_eps=1e-6, rope_theta=500.0,
    )
    return LlamaOptions(**{**base, **overrides})


def perturb_norms(model) -> None:
    """Norm weights start at ones in both libraries; make them distinct so that a wrong
    norm mapping cannot go unnoticed."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)


def forge_model(opts: LlamaOptions, vocab: int = VOCAB):
    torch.manual_seed(0)
    model = build(opts, vocab_size=vocab, attention=SdpaAttention(SdpaOptions()))
    perturb_norms(model)
    return model


def same_logits(actual, expected, model, what="Forge logits against transformers'"):
    """Equal within float32 rounding of a run of ``model``."""
    assert_within_rounding(actual, expected, dtype=torch.float32, terms=longest_sum(model), what=what)


def tokens(seq=16, vocab=VOCAB):
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(3))


def random_hf_llama(path, tie: bool, vocab: int = VOCAB):
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=500.0, tie_word_embeddings=tie, initializer_range=0.2,
    )
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(config).eval()
    perturb_norms(model)
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("tie", [False, True])
def test_exported_folder_loads_in_transformers_with_equal_logits(tmp_path, tie):
    opts = options(tie_embeddings=tie)
    model = forge_model(opts)
    # A compiled/DDP-wrapped model's keys carry prefixes; export strips them.
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    hf_interop.export(state, opts, tmp_path, eos_token_id=2)

    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is tie and config["eos_token_id"] == 2
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False).eval()
    assert hf.dtype == torch.float32
    with torch.no_grad():
        expected = hf(tokens()).logits
        actual = model(tokens())
    same_logits(actual, expected, model)


@pytest.mark.parametrize("tie", [False, True])
def test_forge_model_initialised_from_a_hf_llama_has_equal_logits(tmp_path, tie):
    hf = random_hf_llama(tmp_path, tie)
    # The tokenizer may be smaller than the checkpoint's (padded) vocabulary.
    model = build(options(ffn_hidden=48, tie_embeddings=tie, init_from_hf=str(tmp_path)),
                  vocab_size=VOCAB - 3, attention=SdpaAttention(SdpaOptions()))
    assert model.output.weight.shape[0] == VOCAB
    assert (model.output.weight is model.tok_embeddings.weight) == tie
    with torch.no_grad():
        expected = hf(tokens()).logits
        actual = model(tokens())
    same_logits(actual, expected, model)


def test_hf_initialised_model_matches_each_document_when_packed(tmp_path):
    # Continuing pretraining with packing: packed rows give the HF model's per-document logits.
    hf = random_hf_llama(tmp_path, tie=False)
    model = build(options(ffn_hidden=48, init_from_hf=str(tmp_path)), VOCAB, SdpaAttention(SdpaOptions()))
    doc_ids, positions = packed_metadata([(6, 10)])
    row = tokens()[:1]
    with torch.no_grad():
        packed = model(row, doc_ids=doc_ids, positions=positions)
        second = hf(row[:, 6:]).logits
    same_logits(packed[:, 6:], second, model, "packed second document against transformers on it alone")


def test_init_weights_reloads_the_hf_weights_after_meta_construction(tmp_path):
    hf = random_hf_llama(tmp_path, tie=False)
    opts = options(ffn_hidden=48, init_from_hf=str(tmp_path))
    with torch.device("meta"):
        model = build(opts, VOCAB, SdpaAttention(SdpaOptions()))
    model.to_empty(device="cpu")
    model.init_weights()
    with torch.no_grad():
        same_logits(model(tokens()), hf(tokens()).logits, model)


def test_a_pipeline_part_loads_only_its_own_layers(tmp_path):
    random_hf_llama(tmp_path, tie=False)
    opts = options(ffn_hidden=48)
    part = forge_model(opts)
    del part.layers["0"]
    part.tok_embeddings = None
    hf_interop.load_into(part, tmp_path)
    full = build(options(ffn_hidden=48, init_from_hf=str(tmp_path)), VOCAB, SdpaAttention(SdpaOptions()))
    assert torch.equal(part.layers["1"].attention.wq.weight, full.layers["1"].attention.wq.weight)
    assert torch.equal(part.output.weight, full.output.weight)


def test_mismatched_options_list_every_difference_with_the_fix(tmp_path):
    random_hf_llama(tmp_path, tie=True)
    with pytest.raises(ValueError) as info:
        build(options(dim=64, norm_eps=1e-5, init_from_hf=str(tmp_path)), VOCAB,
              SdpaAttention(SdpaOptions()))
    message = str(info.value)
    assert "model.options.dim=64 but hidden_size=32 (set dim=32)" in message
    assert "norm_eps=1e-05 but rms_norm_eps=1e-06" in message
    assert "tie_embeddings=False but tie_word_embeddings=True" in message
    assert "intermediate_size=48" in message


def test_a_tokenizer_larger_than_the_checkpoint_vocab_is_refused(tmp_path):
    random_hf_llama(tmp_path, tie=False)
    with pytest.raises(ValueError, match=f"tokenizer has {VOCAB + 1} tokens"):
        build(options(ffn_hidden=48, init_from_hf=str(tmp_path)), VOCAB + 1, SdpaAttention(SdpaOptions()))


def test_unsupported_rope_scaling_and_missing_folder_are_explained(tmp_path):
    random_hf_llama(tmp_path, tie=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope type 'llama3' is not supported"):
        hf_interop.check_hf_compatible(options(ffn_hidden=48), tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf_interop.check_hf_compatible(options(), tmp_path / "absent")


def test_key_mapping_round_trips_for_every_parameter():
    model = forge_model(options())
    for key in model.state_dict():
        assert hf_interop.from_hf_key(hf_interop.to_hf_key(key)) == key
    assert hf_interop.from_hf_key("model.layers.0.self_attn.rotary_emb.inv_freq") is None


def test_export_refuses_a_partial_state_dict(tmp_path):
    state = forge_model(options()).state_dict()
    del state["layers.1.feed_forward.w2.weight"]
    with pytest.raises(ValueError, match="missing"):
        hf_interop.export(state, options(), tmp_path)
