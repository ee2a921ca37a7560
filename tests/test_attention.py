"""The attention backends: masks, the conformance kit on multi-block rows, document
isolation of a whole model by equivalence (packed == standalone, proved in float64 and
held to rounding in float32), sdpa's causal fast path, eager as a float64 reference, the
rules. The kit's own negative controls are in test_conformance.py."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from conftest import make_distribution, only_plugins
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from forge_core.api import AttentionBackendSpec, NoOptions
from forge_core.testing import (
    assert_within_rounding,
    check_attention_backend,
    check_document_isolation,
    doc_ids_from_lengths,
    forge_run,
    lognormal_lengths,
    packed_metadata,
    reference_attention,
)
from forge_core.testing.attention import spans
from forge_plugins.attention import eager, flex_kernel, sdpa
from forge_plugins.attention import rules as attention_rules
from forge_plugins.attention.eager import EagerAttention
from forge_plugins.attention.flex import FlexAttention
from forge_plugins.attention.masks import (
    block_mask_bytes,
    causal_mask_mod,
    document_block_mask,
    document_causal_mask,
    document_mask_mod,
)
from forge_plugins.attention.options import FlexOptions, SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention

#: Rows longer than one 16-token flex block, with documents crossing block boundaries,
#: single-token documents and a last document that runs to the end of its row.
MULTI_BLOCK_ROWS = ((5, 1, 11, 7, 9, 1), (1, 16, 7, 10))


@pytest.fixture(scope="module")
def flex() -> FlexAttention:
    # Small blocks so that the test rows span several blocks (and a partial last block).
    return FlexAttention(FlexOptions(block_size=16))


def _backend(name: str, flex: FlexAttention):
    return {"eager": EagerAttention(NoOptions()), "sdpa": SdpaAttention(SdpaOptions()), "flex": flex}[name]


#: PyTorch compiles FlexAttention for CPU only with AVX2 or better, and not at all under
#: ATEN_CPU_CAPABILITY=default (one of the kernel levels CI runs the numerical tests at).
needs_compiled_flex = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
    reason="compiled FlexAttention needs AVX2 on CPU "
    f"(capability here: {torch.backends.cpu.get_cpu_capability()})",
)
BACKENDS = ["eager", "sdpa", pytest.param("flex", marks=needs_compiled_flex)]
#: Compiled flex specialises on shapes: run documents "alone" at the packed shape
#: (equal by causality, see forge_core.testing.isolation) so that the model check
#: reuses the kit's compilations.
STANDALONE = {"eager": "exact", "sdpa": "exact", "flex": "prefix"}
#: The dtypes each backend is checked in: float64 proves, float32 is what trains. CPU
#: FlexAttention compiles for fp32/fp16/bf16 only; its BlockMask is proved in float64
#: through PyTorch's unfused flex_attention below.
DTYPES = {
    "eager": (torch.float64, torch.float32),
    "sdpa": (torch.float64, torch.float32),
    "flex": (torch.float32,),
}


def tiny_llama(backend):
    """A small fp32 llama using ``backend``; a large init makes any leak visible."""
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    torch.manual_seed(0)
    return build(
        LlamaOptions(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=128, init_std=0.3),
        vocab_size=61,
        attention=backend,
    )


# --- packed-row helpers -------------------------------------------------------------


def test_packed_metadata_counts_documents_and_restarts_positions():
    doc_ids, positions = packed_metadata([(2, 1, 3), (4, 2)])
    assert doc_ids.tolist() == [[0, 0, 1, 2, 2, 2], [0, 0, 0, 0, 1, 1]]
    assert positions.tolist() == [[0, 1, 0, 0, 1, 2], [0, 1, 2, 3, 0, 1]]
    assert doc_ids.dtype == positions.dtype == torch.long
    assert spans((2, 1, 3)) == [(0, 2), (2, 3), (3, 6)]
    with pytest.raises(ValueError, match="must be positive and add up to seq_len 3"):
        packed_metadata([(2, 1), (4,)])
    with pytest.raises(ValueError, match="must be positive"):
        packed_metadata([(2, 0, 1)])


def test_lognormal_lengths_fill_the_row_exactly():
    lengths = lognormal_lengths(8192, median=512, seed=3)
    assert sum(lengths) == 8192 and min(lengths) >= 1 and len(lengths) > 4


# --- masks --------------------------------------------------------------------------


def test_dense_document_mask_is_block_diagonal_causal():
    doc_ids, _ = packed_metadata([(2, 1, 2)])
    mask = document_causal_mask(doc_ids, 5, "cpu")
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 0, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert mask.shape == (1, 1, 5, 5)
    assert torch.equal(mask[0, 0], expected)


def test_doc_ids_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match=r"shape \(batch, 6\)"):
        SdpaAttention(SdpaOptions()).prepare(torch.zeros(1, 5, dtype=torch.long), 6, "cpu")


def _tables(block_mask):
    """Block tables with the unused tail of every index row cut off, for comparison."""
    out = {}
    for num, idx in (
        ("kv_num_blocks", "kv_indices"),
        ("full_kv_num_blocks", "full_kv_indices"),
        ("q_num_blocks", "q_indices"),
        ("full_q_num_blocks", "full_q_indices"),
    ):
        counts, indices = getattr(block_mask, num), getattr(block_mask, idx)
        out[num] = counts.tolist()
        out[idx] = [
            indices[b, h, r, : counts[b, h, r]].tolist()
            for b in range(counts.shape[0])
            for h in range(counts.shape[1])
            for r in range(counts.shape[2])
        ]
    return out


@pytest.mark.parametrize("seq_len,block_size", [(300, 128), (1000, 64), (128, 128), (1, 128), (2048, 128)])
@pytest.mark.parametrize("docs_per_1000", [2, 300])
def test_block_mask_tables_equal_create_block_mask(seq_len, block_size, docs_per_1000):
    gen = torch.Generator().manual_seed(seq_len + docs_per_1000)
    doc_ids = torch.cumsum(torch.rand(2, seq_len, generator=gen) < docs_per_1000 / 1000, dim=-1)
    ours = document_block_mask(doc_ids, seq_len, "cpu", block_size)
    reference = create_block_mask(
        document_mask_mod(doc_ids), 2, None, seq_len, seq_len, device="cpu", BLOCK_SIZE=block_size
    )
    assert _tables(ours) == _tables(reference)
    assert torch.equal(ours.to_dense(), reference.to_dense())


def test_causal_block_mask_equals_create_block_mask():
    ours = document_block_mask(None, 300, "cpu", 128)
    reference = create_block_mask(causal_mask_mod, None, None, 300, 300, device="cpu")
    assert _tables(ours) == _tables(reference)


def test_block_mask_falls_back_for_decreasing_doc_ids():
    doc_ids = torch.tensor([[0, 0, 1, 1, 0, 0, 2, 2] * 20])  # 160 tokens, ids go back down
    ours = document_block_mask(doc_ids, 160, "cpu", 16)
    reference = create_block_mask(document_mask_mod(doc_ids), 1, None, 160, 160, device="cpu", BLOCK_SIZE=16)
    assert _tables(ours) == _tables(reference)


def test_block_mask_is_over_100x_smaller_than_the_dense_mask_at_8192():
    doc_ids, _ = packed_metadata([lognormal_lengths(8192, median=512, seed=0)])
    dense_bytes = 8192 * 8192  # one bool per entry
    assert block_mask_bytes(document_block_mask(doc_ids, 8192, "cpu")) * 100 < dense_bytes


# --- sdpa's paths -------------------------------------------------------------------


def test_sdpa_without_doc_ids_takes_the_is_causal_path_with_no_mask():
    backend = SdpaAttention(SdpaOptions())
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    prepared = backend.prepare(None, 6, "cpu")
    assert prepared is None
    with mock.patch.object(
        sdpa.F, "scaled_dot_product_attention", wraps=sdpa.F.scaled_dot_product_attention
    ) as spy:
        backend.attend(q, k, v, prepared)
    ((args, kwargs),) = spy.call_args_list
    assert kwargs["is_causal"] is True
    assert kwargs.get("attn_mask") is None and len(args) == 3
    assert kwargs["enable_gqa"] is True


def test_sdpa_with_doc_ids_passes_the_shared_dense_mask():
    backend = SdpaAttention(SdpaOptions())
    doc_ids, _ = packed_metadata([(2, 4)])
    q = k = v = torch.randn(1, 2, 6, 8)
    prepared = backend.prepare(doc_ids, 6, "cpu")
    with mock.patch.object(
        sdpa.F, "scaled_dot_product_attention", wraps=sdpa.F.scaled_dot_product_attention
    ) as spy:
        backend.attend(q, k, v, prepared)
    ((_, kwargs),) = spy.call_args_list
    assert kwargs["attn_mask"] is prepared and not kwargs.get("is_causal", False)
    assert kwargs["enable_gqa"] is False


# --- conformance and model-level isolation -------------------------------------------


@pytest.mark.numerical
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_passes_the_kit_on_multi_block_rows(name):
    # Agreement with the float64 reference (forward and backward, with and without
    # doc_ids, grouped-query and multi-head) and isolation at the q/k/v level, on rows
    # that span several 16-token flex blocks; in float32 and, where the backend has a
    # float64 kernel, in float64.
    options = {"block_size": 16} if name == "flex" else None
    check_attention_backend(
        name, options=options, layouts=MULTI_BLOCK_ROWS, float64=torch.float64 in DTYPES[name]
    )


@pytest.mark.numerical
@pytest.mark.parametrize("name", BACKENDS)
def test_model_isolation_packed_logits_and_grads_equal_each_document_alone(name, flex):
    worst = check_document_isolation(
        tiny_llama(_backend(name, flex)),
        rows=MULTI_BLOCK_ROWS,
        standalone=STANDALONE[name],
        dtypes=DTYPES[name],
    )
    assert set(worst) == set(DTYPES[name]) and max(worst.values()) < 1


@pytest.fixture
def unfused_flex(monkeypatch):
    """FlexAttention whose kernel is PyTorch's unfused flex_attention (every dtype, same
    BlockMask semantics) instead of the compiled one."""
    monkeypatch.setattr(flex_kernel, "compiled", flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield FlexAttention(FlexOptions(block_size=16))


@pytest.mark.numerical
def test_flex_block_mask_isolates_documents_in_float64(unfused_flex):
    # The compiled CPU kernel takes no float64; the BlockMask it is given (and the CPU
    # backward that walks it) is proved here, the kernel held to float32 rounding above.
    check_attention_backend(unfused_flex, layouts=MULTI_BLOCK_ROWS, dtype="float64")
    worst = check_document_isolation(
        tiny_llama(unfused_flex), rows=MULTI_BLOCK_ROWS, standalone="prefix", dtypes=(torch.float64,)
    )
    assert set(worst) == {torch.float64}


class _IgnoresDocIds(SdpaAttention):
    """A broken backend: plain causal attention whatever the doc_ids."""

    def prepare(self, doc_ids, seq_len, device):
        return None


class _MixesInOtherDocuments(SdpaAttention):
    """A subtle leak: a 1e-10 share of plain causal attention (which sees other
    documents) mixed into the isolated output, far below float32 rounding."""

    def attend(self, q, k, v, prepared):
        out = super().attend(q, k, v, prepared)
        if prepared is None:
            return out
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return out + 1e-10 * (causal - out)


class _CausalBackward(torch.autograd.Function):
    """Masked attention forward; the backward of plain causal attention."""

    @staticmethod
    def forward(ctx, q, k, v, mask):
        ctx.save_for_backward(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])

    @staticmethod
    def backward(ctx, grad):
        leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(
                *leaves, is_causal=True, enable_gqa=leaves[0].shape[1] != leaves[1].shape[1]
            )
        return (*torch.autograd.grad(out, leaves, grad), None)


class _LeaksOnlyInBackward(SdpaAttention):
    """Exact logits; gradients that flow across documents."""

    def attend(self, q, k, v, prepared):
        if prepared is None:
            return super().attend(q, k, v, prepared)
        return _CausalBackward.apply(q, k, v, prepared)


@pytest.mark.numerical
@pytest.mark.parametrize("standalone", ["exact", "prefix"])
def test_model_check_catches_a_backend_that_ignores_doc_ids(standalone):
    with pytest.raises(
        AssertionError, match=r"^float64: row 0 document 1 \(tokens 5:6\): packed logits differ"
    ):
        check_document_isolation(tiny_llama(_IgnoresDocIds(SdpaOptions())), standalone=standalone)
    with pytest.raises(
        AssertionError, match=r"^float32: row 0 document 1 \(tokens 5:6\): packed logits differ"
    ):
        check_document_isolation(
            tiny_llama(_IgnoresDocIds(SdpaOptions())), standalone=standalone, dtypes=(torch.float32,)
        )


@pytest.mark.numerical
def test_model_check_catches_a_leak_below_float32_rounding():
    backend = _MixesInOtherDocuments(SdpaOptions())
    # float64: the logits themselves give it away (~1e-8 of a row against ~1e-14).
    with pytest.raises(
        AssertionError,
        match=r"^float64: row 0 document 1 \(tokens 5:6\): packed logits differ "
        r".*exceeds the rounding tolerance of float64",
    ):
        check_document_isolation(tiny_llama(backend), rows=MULTI_BLOCK_ROWS)
    # float32: the logits agree within rounding; the gradient on other documents, which
    # must be exactly 0, does not.
    with pytest.raises(
        AssertionError,
        match=r"^float32: the loss of document 6:17 has gradient on other documents' tokens "
        r"\(embedding output 0\): \d+ entries are not exactly 0",
    ):
        check_document_isolation(tiny_llama(backend), rows=MULTI_BLOCK_ROWS, dtypes=(torch.float32,))


@pytest.mark.numerical
def test_model_check_catches_a_leak_in_the_backward_only():
    with pytest.raises(
        AssertionError, match=r"^float64: the loss of document 6:17 has gradient on other documents' tokens"
    ):
        check_document_isolation(tiny_llama(_LeaksOnlyInBackward(SdpaOptions())), rows=MULTI_BLOCK_ROWS)


@pytest.mark.numerical
def test_model_check_prefix_standalone_agrees_with_exact_standalone():
    # Both modes pass on a correct backend, in float64 and float32.
    for standalone in ("exact", "prefix"):
        worst = check_document_isolation(
            tiny_llama(SdpaAttention(SdpaOptions())), rows=MULTI_BLOCK_ROWS, standalone=standalone
        )
        assert set(worst) == {torch.float64, torch.float32}


@pytest.mark.numerical
def test_eager_in_float64_is_a_float64_reference():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 34, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 34, 8, generator=g, dtype=torch.float64) for _ in range(2))
    backend = EagerAttention(NoOptions())
    for doc_ids in (None, doc_ids_from_lengths(MULTI_BLOCK_ROWS, 34)):
        out = backend.attend(q, k, v, backend.prepare(doc_ids, 34, "cpu"))
        assert out.dtype == torch.float64
        # About 1e-14 of each row: a float32 softmax inside would be off by ~1e-7.
        assert_within_rounding(
            out, reference_attention(q, k, v, doc_ids), dtype=torch.float64, terms=34, what="eager"
        )


@pytest.mark.parametrize(
    ("dtype", "softmax_dtype"),
    [
        (torch.float64, torch.float64),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
    ],
)
def test_eager_softmax_follows_the_input_dtype_but_never_below_fp32(dtype, softmax_dtype):
    q = k = v = torch.randn(1, 2, 4, 8).to(dtype)
    with mock.patch.object(eager.torch, "softmax", wraps=torch.softmax) as spy:
        out = eager.eager_attention(q, k, v, torch.ones(4, 4, dtype=torch.bool).tril())
    assert spy.call_args.kwargs["dtype"] == softmax_dtype
    assert out.dtype == dtype


def test_flex_causal_block_mask_is_cached_per_length():
    backend = FlexAttention(FlexOptions())
    assert backend.prepare(None, 40, "cpu") is backend.prepare(None, 40, "cpu")
    assert backend.prepare(None, 40, "cpu") is not backend.prepare(None, 48, "cpu")


def test_backends_refuse_head_counts_that_do_not_group(flex):
    q, kv = torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8)
    for backend in (EagerAttention(NoOptions()), flex):
        with pytest.raises(ValueError, match="multiple of key/value heads"):
            backend.attend(q, kv, kv, backend.prepare(None, 4, "cpu"))


# --- registration and rules ---------------------------------------------------------


def _ctx(
    backend="sdpa",
    honours=("doc_ids",),
    emitted=("doc_ids", "positions"),
    seq_len=1024,
    options=None,
    packer="concat",
):
    spec = AttentionBackendSpec(
        name=backend, summary="s", impl="m:X", options=SdpaOptions, honours=set(honours)
    )
    config = SimpleNamespace(
        data=SimpleNamespace(packer=packer, seq_len=seq_len),
        attention=SimpleNamespace(backend=backend, options=options or SdpaOptions()),
    )
    return SimpleNamespace(config=config, specs={"attention": spec}, emitted=frozenset(emitted))


def test_rule_backend_must_honour_emitted_doc_ids():
    from forge_core.core_rules import check_honours_doc_ids as check

    message = check(_ctx(backend="window", honours=()))
    assert "'concat' emits doc_ids" in message and "'window' does not honour" in message
    assert check(_ctx(backend="window", honours=(), emitted=())) is None
    assert check(_ctx(backend="flex")) is None


def test_rule_sdpa_dense_mask_warns_from_the_threshold_seq_len():
    check = attention_rules.check_sdpa_dense_mask
    assert check(_ctx(seq_len=4095)) is None
    message = check(_ctx(seq_len=4096))
    assert "4096x4096" in message and "16 MiB" in message and "flex" in message
    assert check(_ctx(seq_len=8192, emitted=())) is None  # no isolation: causal flash path
    assert check(_ctx(backend="flex", seq_len=8192)) is None
    assert check(_ctx(seq_len=8192, options=SdpaOptions(dense_mask_warn_seq_len=16384))) is None
    assert check(_ctx(seq_len=2048, options=SdpaOptions(dense_mask_warn_seq_len=2048))) is not None


# --- the rules through `forge-run check` ---------------------------------------------

PACKED = {
    "model": {
        "name": "llama",
        "options": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 8192},
    },
    "attention": {"backend": "flex"},
    "data": {"packer": "concat", "packer_options": {"isolate": True}, "seq_len": 512},
}

#: A third-party backend that does not mask across documents (a name of its own: the
#: example package registers a ``window`` backend).
MASKLESS_PLUGIN = """
from forge_core.api import AttentionBackendSpec, hookimpl

@hookimpl
def forge_attention_backends():
    return [AttentionBackendSpec(name="maskless_window", summary="Sliding window, no doc_ids",
                                 impl="masklessplug:Window")]
"""


def test_check_refuses_a_backend_that_ignores_the_packers_doc_ids(forge_config, tmp_path):
    site = make_distribution(
        tmp_path / "site",
        "forge-maskless",
        "0.1",
        {"masklessplug": MASKLESS_PLUGIN},
        {"maskless": "masklessplug"},
    )
    backend, env = "attention.backend=maskless_window", only_plugins("maskless")
    result = forge_run(["check", forge_config(PACKED), backend], paths=[site], env=env)
    assert result.code == 2, result.stdout + result.stderr
    assert "[attention.honours-doc-ids] (plugin 'core_rules')" in result.stdout
    assert "$.data.packer = 'concat', $.attention.backend = 'maskless_window'" in result.stdout
    # Without isolation nothing needs honouring.
    result = forge_run(
        ["check", forge_config(PACKED), backend, "data.packer_options.isolate=false"], paths=[site], env=env
    )
    assert result.code == 0, result.stdout + result.stderr


def test_check_warns_about_sdpa_dense_masks_from_the_threshold(forge_config):
    path = forge_config(PACKED)
    warned = forge_run(["check", path, "attention.backend=sdpa", "data.seq_len=4096"])
    assert warned.code == 0, warned.stdout + warned.stderr
    assert "warning: [sdpa.dense-mask-long-seq]" in warned.stdout
    assert "4096x4096" in warned.stdout
    for overrides in (
        ["data.seq_len=4095"],
        ["data.seq_len=4096", "attention.options.dense_mask_warn_seq_len=8192"],
        ["data.seq_len=4096", "data.packer_options.isolate=false"],
    ):
        quiet = forge_run(["check", path, "attention.backend=sdpa", *overrides])
        assert quiet.code == 0 and "sdpa.dense-mask-long-seq" not in quiet.stdout, overrides
    assert "sdpa.dense-mask-long-seq" not in forge_run(["check", path, "data.seq_len=4096"]).stdout
