"""The ``llama`` model: structure and names, rotary positions, init, meta-device
construction, pipeline-style partial models, option checks and the model rules.
Identities are checked in float64 (the model cast), within float64 rounding."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import attrs
import pytest
import torch

from forge_core.api import NoOptions
from forge_core.testing import (
    ROUNDING_FACTOR,
    assert_within_rounding,
    forge_run,
    longest_sum,
    packed_metadata,
)
from forge_plugins.attention.eager import EagerAttention
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models import rules as model_rules
from forge_plugins.models.llama import Llama, build
from forge_plugins.models.options import LlamaOptions, ffn_hidden_size
from forge_plugins.models.rotary import apply_rotary, rotary_table

SMALL = LlamaOptions(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=64, init_std=0.2)
VOCAB = 50


def small_model(options: LlamaOptions = SMALL, backend=None, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return build(options, vocab_size=VOCAB, attention=backend or SdpaAttention(SdpaOptions()))


def ids(batch=2, seq=12, seed=1):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def same_in_float64(got, want, what, model=None):
    """``got`` equals ``want`` within float64 rounding of a run of ``model`` (default:
    the small model)."""
    assert_within_rounding(
        got, want, dtype=torch.float64, terms=longest_sum(model or small_model()), what=what
    )


# --- structure ----------------------------------------------------------------------


def test_state_dict_names_are_stable_and_exclude_the_rotary_table():
    model = small_model()
    keys = set(model.state_dict())
    per_layer = {
        "attention_norm.weight",
        "attention.wq.weight",
        "attention.wk.weight",
        "attention.wv.weight",
        "attention.wo.weight",
        "ffn_norm.weight",
        "feed_forward.w1.weight",
        "feed_forward.w2.weight",
        "feed_forward.w3.weight",
    }
    expected = {"tok_embeddings.weight", "norm.weight", "output.weight"}
    expected |= {f"layers.{i}.{name}" for i in range(3) for name in per_layer}
    assert keys == expected
    assert isinstance(model.layers, torch.nn.ModuleDict) and list(model.layers) == ["0", "1", "2"]
    assert model.layers["0"].attention.wk.weight.shape == (2 * 8, 32)  # GQA: 2 kv heads of 8
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_forward_returns_logits_and_the_backend_builds_one_mask_per_forward():
    calls = {"prepare": 0, "attend": 0}

    class Counting(EagerAttention):
        def prepare(self, doc_ids, seq_len, device):
            calls["prepare"] += 1
            return super().prepare(doc_ids, seq_len, device)

        def attend(self, q, k, v, prepared):
            calls["attend"] += 1
            assert q.shape == (2, 4, 12, 8) and k.shape == (2, 2, 12, 8)
            return super().attend(q, k, v, prepared)

    model = small_model(backend=Counting(NoOptions()))
    logits = model(ids())
    assert logits.shape == (2, 12, VOCAB)
    assert calls == {"prepare": 1, "attend": 3}


def test_ffn_hidden_is_computed_the_llama_way_unless_given():
    assert ffn_hidden_size(LlamaOptions()) == 704  # 2/3 * 4 * 256 = 682.7 -> multiple of 64
    assert ffn_hidden_size(LlamaOptions(dim=32, multiple_of=16)) == 96
    assert ffn_hidden_size(LlamaOptions(ffn_hidden=100)) == 100
    model = small_model(LlamaOptions(dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=40))
    assert model.layers["0"].feed_forward.w1.weight.shape == (40, 32)


# --- rotary -------------------------------------------------------------------------


def test_rotary_with_positions_equals_the_table_rows_of_those_positions():
    cos, sin = rotary_table(8, 16, 10000.0)
    x = torch.randn(1, 3, 2, 8, generator=torch.Generator().manual_seed(0))
    model = small_model()
    c, s = model.rope(3, torch.tensor([[5, 6, 7]]))
    # The same table entries through the same elementwise operations: bit for bit.
    expected = apply_rotary(x, cos[5:8][None, :, None], sin[5:8][None, :, None])
    assert torch.equal(apply_rotary(x, c, s), expected)
    # Position 0 is the identity rotation.
    c0, s0 = model.rope(3, torch.zeros(1, 3, dtype=torch.long))
    assert torch.equal(apply_rotary(x, c0, s0), x)


@pytest.mark.numerical
def test_rotary_preserves_norms_and_depends_only_on_relative_position():
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64) for _ in range(2))
    model = small_model()

    def at(t, p):
        c, s = model.rope(1, torch.tensor([[p]]))
        return apply_rotary(t, c, s)

    # Both are identities, evaluated in float64, except that the cos/sin table is float32
    # (computed as transformers does): an angle of up to 14 rad is off by about
    # 14 * eps32, which moves a rotated vector by that times its norm.
    rotation_error = ROUNDING_FACTOR * torch.finfo(torch.float32).eps * 14
    assert abs(at(x, 9).norm() - x.norm()) <= rotation_error * x.norm()
    dot_tol = 2 * rotation_error * x.norm() * y.norm()  # two rotated vectors on each side
    assert abs((at(x, 7) * at(y, 3)).sum() - (at(x, 14) * at(y, 10)).sum()) <= dot_tol
    assert (
        abs((at(x, 7) * at(y, 3)).sum() - (at(x, 7) * at(y, 4)).sum()) > 1e3 * dot_tol
    )  # the test has power


@pytest.mark.numerical
def test_forward_uses_positions_when_given():
    model = small_model().double()
    tokens = ids()
    arange = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        default = model(tokens)
        explicit = model(tokens, positions=arange)
        all_zero = model(tokens, positions=torch.zeros_like(tokens))
    same_in_float64(explicit, default, "explicit positions 0..11")
    assert (default[:, 1:] - all_zero[:, 1:]).abs().max() > 1e-3 * default.abs().max()


def test_sequences_longer_than_max_seq_len_are_refused():
    with pytest.raises(ValueError, match="max_seq_len=64"):
        small_model()(ids(seq=65))


# --- init ---------------------------------------------------------------------------


def test_init_scheme_matches_the_documented_stds():
    options = LlamaOptions(dim=256, n_layers=8, n_heads=8, n_kv_heads=4, init_std=0.02)
    model = small_model(options)
    layer = model.layers["3"]
    residual = 0.02 / math.sqrt(2 * 8)
    for weight, std in (
        (model.tok_embeddings.weight, 0.02),
        (model.output.weight, 0.02),
        (layer.attention.wq.weight, 0.02),
        (layer.feed_forward.w1.weight, 0.02),
        (layer.attention.wo.weight, residual),
        (layer.feed_forward.w2.weight, residual),
    ):
        assert weight.std().item() == pytest.approx(std, rel=0.05)
        assert abs(weight.mean().item()) < std / 10
    assert torch.equal(layer.ffn_norm.weight, torch.ones(256))
    assert torch.equal(model.norm.weight, torch.ones(256))


@pytest.mark.numerical
def test_tied_embeddings_share_one_matrix_and_get_both_gradients():
    options = LlamaOptions(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, tie_embeddings=True)
    model = small_model(options).double()
    assert model.output.weight is model.tok_embeddings.weight
    assert len({id(p) for p in model.parameters()}) == len(list(model.parameters()))
    model(ids()).sum().backward()
    assert model.tok_embeddings.weight.grad is not None
    # The shared matrix's gradient is the embedding's plus the output's, as an untied
    # copy with the same weights computes them separately.
    untied = small_model(attrs.evolve(options, tie_embeddings=False)).double()
    untied.load_state_dict(model.state_dict())
    untied(ids()).sum().backward()
    both = untied.tok_embeddings.weight.grad + untied.output.weight.grad
    assert untied.tok_embeddings.weight.grad.abs().sum() > 0 and untied.output.weight.grad.abs().sum() > 0
    same_in_float64(model.tok_embeddings.weight.grad, both, "tied gradient", model)


@pytest.mark.parametrize("tie", [False, True])
def test_meta_device_construction_then_init_weights_is_a_complete_model(tie):
    options = LlamaOptions(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, tie_embeddings=tie)
    backend = SdpaAttention(SdpaOptions())
    with torch.device("meta"):
        meta = build(options, vocab_size=VOCAB, attention=backend)
    assert meta.tok_embeddings.weight.is_meta
    meta.to_empty(device="cpu")
    torch.manual_seed(7)
    meta.init_weights()
    reference = build(options, vocab_size=VOCAB, attention=backend)
    torch.manual_seed(7)
    reference.init_weights()
    assert (meta.output.weight is meta.tok_embeddings.weight) == tie
    for (name, a), b in zip(meta.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(meta.rope.cos, reference.rope.cos)  # the table is rebuilt too
    with torch.no_grad():
        assert torch.equal(meta(ids()), reference(ids()))


# --- pipeline-style partial models --------------------------------------------------


@pytest.mark.numerical
def test_split_model_parts_chain_to_the_full_logits_with_unchanged_keys():
    model = small_model().double()
    doc_ids, positions = packed_metadata([(5, 7), (12,)])
    tokens = ids()
    with torch.no_grad():
        full = model(tokens, doc_ids=doc_ids, positions=positions)
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    del first.layers["2"]
    first.norm = first.output = None
    del last.layers["0"], last.layers["1"]
    last.tok_embeddings = None
    with torch.no_grad():
        hidden = first(tokens, doc_ids=doc_ids, positions=positions)
        assert hidden.shape == (2, 12, 32)
        chained = last(hidden, doc_ids=doc_ids, positions=positions)
    same_in_float64(chained, full, "chained parts")
    full_keys = set(model.state_dict())
    assert set(first.state_dict()) | set(last.state_dict()) == full_keys
    assert "layers.2.attention.wq.weight" in last.state_dict()


def test_a_part_without_embedding_refuses_token_ids():
    model = small_model()
    model.tok_embeddings = None
    with pytest.raises(ValueError, match="pass hidden states"):
        model(ids())


# --- options and rules --------------------------------------------------------------


def test_invalid_head_layouts_fail_at_build_with_the_rule_message():
    with pytest.raises(ValueError, match="n_heads=6 is not a multiple of n_kv_heads=4"):
        build(LlamaOptions(dim=48, n_heads=6, n_kv_heads=4), 10, SdpaAttention(SdpaOptions()))
    with pytest.raises(ValueError, match="= 3 is odd"):
        build(LlamaOptions(dim=12, n_heads=4, n_kv_heads=2), 10, SdpaAttention(SdpaOptions()))


def test_options_refuse_non_positive_sizes():
    with pytest.raises(ValueError):
        LlamaOptions(n_kv_heads=0)
    with pytest.raises(ValueError):
        LlamaOptions(norm_eps=0.0)


def _ctx(options):
    return SimpleNamespace(config=SimpleNamespace(model=SimpleNamespace(options=options)))


def test_rule_heads_divisible():
    check = model_rules.check_heads_divisible
    assert check(_ctx(LlamaOptions(n_heads=8, n_kv_heads=4))) is None
    assert check(_ctx(LlamaOptions(n_heads=8, n_kv_heads=8))) is None
    assert "n_heads=8 is not a multiple of n_kv_heads=3" in check(_ctx(LlamaOptions(n_heads=8, n_kv_heads=3)))
    # Another model's options are not judged by llama's rules.
    assert check(_ctx(SimpleNamespace(n_heads=8, n_kv_heads=3))) is None


def test_rule_head_dim_even():
    check = model_rules.check_head_dim_even
    assert check(_ctx(LlamaOptions(dim=256, n_heads=8))) is None
    assert "= 3 is odd" in check(_ctx(LlamaOptions(dim=24, n_heads=8)))
    assert "dim=100 is not a multiple of n_heads=8" in check(_ctx(LlamaOptions(dim=100, n_heads=8)))


def test_check_reports_both_head_layout_errors(forge_config):
    path = forge_config({"model": {"name": "llama", "options": {"dim": 100, "n_heads": 4, "n_kv_heads": 3}}})
    result = forge_run(["check", path])
    assert result.code == 2, result.stdout + result.stderr
    assert "error: [llama.heads-divisible] (plugin 'models')" in result.stdout
    assert "$.model.options.n_heads = 4, $.model.options.n_kv_heads = 3" in result.stdout
    assert "error: [llama.head-dim-even]" in result.stdout and "= 25 is odd" in result.stdout
    assert forge_run(["check", path, "model.options.dim=96", "model.options.n_kv_heads=2"]).code == 0
