"""The conformance kit (forge_core.testing): the built-in packers and rules pass it, and it
fails, with a message naming the problem, on deliberately broken components (including
leaks across documents far below float32 rounding); its tolerances follow from the dtype
and the size of what is compared. The built-in attention backends are run through it in
test_attention.py (on multi-block rows)."""

from __future__ import annotations

import types

import attrs
import numpy as np
import pytest

from forge_core.api import DOC_IDS, IGNORE_INDEX, POSITIONS, AttentionBackendSpec, PackerSpec, Rule, hookimpl
from forge_core.testing import check_packer, check_rule

torch = pytest.importorskip("torch")
F = torch.nn.functional

from forge_core.testing import (  # noqa: E402
    ROUNDING_FACTOR,
    assert_exactly_zero,
    assert_within_rounding,
    check_attention_backend,
    longest_sum,
    reference_attention,
    rounding_tolerance,
)

# --- attention backends -----------------------------------------------------------------


class _Causal:
    """A correct causal backend without document masking (prepare ignores doc_ids)."""

    def __init__(self, options):
        self.options = options

    def prepare(self, doc_ids, seq_len, device):
        return None

    def attend(self, q, k, v, prepared):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class _Masked(_Causal):
    """A correct backend with document masking, the base of the broken variants."""

    def prepare(self, doc_ids, seq_len, device):
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
        if doc_ids is None:
            return causal
        return (causal & (doc_ids[:, :, None] == doc_ids[:, None, :]))[:, None]

    def attend(self, q, k, v, prepared):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=prepared, enable_gqa=q.shape[1] != k.shape[1]
        )


class _WrongGqaHeads(_Masked):
    """Maps query heads to key/value heads round-robin (repeat) instead of in groups."""

    def attend(self, q, k, v, prepared):
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(
            q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), attn_mask=prepared
        )


class _FirstRowMask(_Masked):
    """Builds the mask from the first row's doc_ids only and broadcasts it."""

    def prepare(self, doc_ids, seq_len, device):
        return super().prepare(None if doc_ids is None else doc_ids[:1], seq_len, device)


class _NotCausal(_Masked):
    def prepare(self, doc_ids, seq_len, device):
        if doc_ids is None:
            return None
        return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]


class _Detached(_Masked):
    def attend(self, q, k, v, prepared):
        return super().attend(q, k, v, prepared).detach()


class _WrongBackwardFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask):
        ctx.save_for_backward(q, k, v)
        ctx.mask = mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return grad, torch.zeros_like(k), torch.zeros_like(v), None  # wrong on purpose


class _WrongBackward(_Masked):
    def attend(self, q, k, v, prepared):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return _WrongBackwardFn.apply(q, k, v, prepared)


class _WrongScale(_Masked):
    """A small numerical error: queries scaled by 1%."""

    def attend(self, q, k, v, prepared):
        return super().attend(q * 1.01, k, v, prepared)


class _LeaksAfterFirstBlock(_Masked):
    """Masks documents only within the first 16 positions, like a tiled kernel whose
    later tiles ignore doc_ids: invisible on rows of 16 tokens."""

    def prepare(self, doc_ids, seq_len, device):
        mask = super().prepare(doc_ids, seq_len, device)
        if doc_ids is None:
            return mask
        mask = mask.clone()
        mask[..., 16:, :] = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[16:]
        return mask


class _MixesInOtherDocuments(_Masked):
    """A subtle leak: a 1e-10 share of plain causal attention (which sees other
    documents) in every output, far below float32 rounding."""

    def attend(self, q, k, v, prepared):
        out = super().attend(q, k, v, prepared)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return out + 1e-10 * (causal - out)


class _Float32Softmax(_Masked):
    """Correct, but computes in float32 whatever the input dtype (as eager once did)."""

    def attend(self, q, k, v, prepared):
        return super().attend(q.float(), k.float(), v.float(), prepared).to(q.dtype)


class _NoFloat64(_Masked):
    def attend(self, q, k, v, prepared):
        if q.dtype == torch.float64:
            raise NotImplementedError("no float64 kernel")
        return super().attend(q, k, v, prepared)


@pytest.mark.numerical
def test_backend_ignoring_doc_ids_fails_document_isolation():
    with pytest.raises(
        AssertionError, match=r"document isolation broken at row 0, document 1 .*attend across documents"
    ):
        check_attention_backend(_Causal)


@pytest.mark.numerical
def test_reference_agreement_with_doc_ids_catches_ignored_doc_ids_on_its_own():
    # The kit runs isolation first, and isolation catches this backend; agreement with the
    # reference under doc_ids must catch it too, so that neither check hides behind the other.
    from forge_core.testing.attention import LAYOUTS, _Case, doc_ids_from_lengths

    case = _Case(_Causal(None), "cpu", torch.float32, 4, 2, 0, None, ROUNDING_FACTOR, "ignores", LAYOUTS)
    case.agrees_with_reference(doc_ids=None)
    with pytest.raises(AssertionError, match=r"causal with doc_ids: forward .* differs from the reference"):
        case.agrees_with_reference(doc_ids=doc_ids_from_lengths(LAYOUTS, 16))


@pytest.mark.numerical
def test_kit_catches_a_small_numerical_error():
    with pytest.raises(
        AssertionError,
        match=r"causal without doc_ids: forward \(no_grad, call 1 .* differs from the reference",
    ):
        check_attention_backend(_WrongScale)


@pytest.mark.numerical
def test_a_leak_below_float32_rounding_is_caught_in_float64_and_by_the_exact_zero_gradient():
    from forge_core.testing.attention import LAYOUTS, _Case, doc_ids_from_lengths

    doc_ids = doc_ids_from_lengths(LAYOUTS, 16)
    # float32: outputs agree with each document alone within rounding...
    case = _Case(
        _MixesInOtherDocuments(None), "cpu", torch.float32, 4, 2, 0, None, ROUNDING_FACTOR, "mixes", LAYOUTS
    )
    case.isolates_documents(doc_ids)
    # ...but the gradient reaching other documents is not exactly 0.
    with pytest.raises(
        AssertionError,
        match=r"document isolation broken at row 0, document 1 \(positions 5\.\.5 of 16\): "
        r"the gradient of its outputs reaches the [qkv] of position [0-4] \(document 0, head \d\) "
        r".* must be exactly 0",
    ):
        case.gradient_stays_in_document(doc_ids)
    # float64 sees it in the outputs themselves.
    case = _Case(
        _MixesInOtherDocuments(None), "cpu", torch.float64, 4, 2, 0, None, ROUNDING_FACTOR, "mixes", LAYOUTS
    )
    with pytest.raises(
        AssertionError,
        match=r"document isolation broken at row 0, document 1 "
        r".*output differs .*rounding tolerance of float64",
    ):
        case.isolates_documents(doc_ids)
    # The whole kit, float32 first: the exact-zero gradient check is what fails.
    with pytest.raises(
        AssertionError,
        match=r"float32, 4 query / 2 key-value heads: document isolation broken at row 0, document 1 "
        r".*must be exactly 0",
    ):
        check_attention_backend(_MixesInOtherDocuments)


@pytest.mark.numerical
def test_float64_run_requires_a_backend_that_follows_its_input_dtype():
    check_attention_backend(_Float32Softmax, float64=False)  # fine within float32 rounding
    with pytest.raises(
        AssertionError,
        match=r"float64, 4 query / 2 key-value heads, causal without doc_ids: forward "
        r".* exceeds the rounding tolerance of float64",
    ):
        check_attention_backend(_Float32Softmax)
    with pytest.raises(
        AssertionError,
        match=r"on cpu, float64, .*failed on float64 inputs "
        r"\(NotImplementedError: no float64 kernel\).*float64=False",
    ):
        check_attention_backend(_NoFloat64)
    check_attention_backend(_NoFloat64, float64=False)


def test_fixed_tolerances_are_refused_with_the_replacement():
    with pytest.raises(ValueError, match="no longer takes atol/rtol.*rounding_factor="):
        check_attention_backend("eager", atol=1e-5, rtol=1e-4)
    import forge_core.testing

    with pytest.raises(AttributeError, match="replaced by assert_within_rounding"):
        forge_core.testing.assert_close  # noqa: B018


@pytest.mark.numerical
def test_rounding_tolerance_follows_dtype_sum_length_and_row_size():
    want = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)  # row norms 5 and 0
    tol = rounding_tolerance(want, torch.float32, terms=16)
    eps32 = torch.finfo(torch.float32).eps
    rms = (25 / 2) ** 0.5  # a row that cancels to 0 gets the typical row's size
    assert torch.allclose(
        tol, torch.tensor([[5.0], [rms]], dtype=torch.float64) * ROUNDING_FACTOR * eps32 * 4
    )
    assert torch.allclose(
        rounding_tolerance(want, torch.float64, 16) / tol,
        torch.tensor(torch.finfo(torch.float64).eps / eps32, dtype=torch.float64),
    )
    assert torch.allclose(
        rounding_tolerance(want, torch.float32, 64) / tol, torch.tensor(2.0, dtype=torch.float64)
    )
    # A result smaller than its terms (cancellation) is held to the size of the terms.
    assert torch.allclose(
        rounding_tolerance(want, torch.float32, 16, scale=50.0),
        tol.new_tensor(50.0) * ROUNDING_FACTOR * eps32 * 4,
    )
    # Half precision: results rounded to bf16, sums accumulated in fp32.
    half = rounding_tolerance(want[:1], torch.bfloat16, 16)
    expected = ROUNDING_FACTOR * (torch.finfo(torch.bfloat16).eps + eps32 * 4) * 5
    assert half.item() == pytest.approx(expected)
    with pytest.raises(ValueError, match="terms must be at least 1"):
        rounding_tolerance(want, torch.float32, 0)
    # A model's longest sum: its largest parameter dimension, or the sequence.
    assert longest_sum(torch.nn.Linear(3, 7), seq_len=5) == 7
    assert longest_sum(torch.nn.Linear(3, 7), seq_len=9) == 9


@pytest.mark.numerical
def test_assert_within_rounding_passes_rounding_and_names_a_real_difference():
    want = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ratio = assert_within_rounding(want.float(), want, dtype=torch.float32, terms=1, what="rounded")
    assert 0 < ratio < 1
    wrong = want.clone()
    wrong[1, 2] += 1e-4 * want[1].norm()
    with pytest.raises(
        AssertionError,
        match=r"off: max \|difference\| .* exceeds the rounding tolerance of float32 "
        r".* first mismatch at \[token 1, dim 2\]",
    ):
        assert_within_rounding(wrong, want, dtype=torch.float32, terms=1, what="off", dims=("token", "dim"))
    with pytest.raises(AssertionError, match="non-finite value nan"):
        assert_within_rounding(
            torch.full((2, 2), float("nan")), torch.zeros(2, 2), dtype=torch.float32, terms=1, what="x"
        )


@pytest.mark.numerical
def test_assert_exactly_zero_counts_what_is_not():
    assert_exactly_zero(torch.zeros(2, 3), "zeros")
    grad = torch.zeros(2, 3)
    grad[1, 2] = 1e-30
    with pytest.raises(
        AssertionError,
        match=r"leak: 1 entries are not exactly 0 \(largest \|value\| 1e-30\); first at \[row 1, dim 2\]",
    ):
        assert_exactly_zero(grad, "leak", ("row", "dim"))


@pytest.mark.numerical
def test_layouts_reach_the_checks():
    check_attention_backend(_LeaksAfterFirstBlock)  # default rows are 16 tokens: no leak
    with pytest.raises(
        AssertionError, match=r"document isolation broken at row 0, document 3 \(positions 12\.\.22 of 24\)"
    ):
        check_attention_backend(_LeaksAfterFirstBlock, layouts=((5, 1, 6, 11, 1), (1, 9, 14)))
    with pytest.raises(ValueError, match=r"document lengths \(4,\) must be positive and add up to seq_len 5"):
        check_attention_backend("eager", layouts=((3, 2), (4,)))
    with pytest.raises(ValueError, match="must be positive"):
        check_attention_backend("eager", layouts=((3, 0, 2),))


@pytest.mark.numerical
def test_backend_ignoring_doc_ids_fails_when_its_spec_declares_it_honours_them():
    spec = AttentionBackendSpec(name="liar", summary="s", impl=f"{__name__}:_Causal", honours={DOC_IDS})
    with pytest.raises(AssertionError, match="attention 'liar'.*document isolation broken"):
        check_attention_backend(spec)


@pytest.mark.numerical
def test_backend_that_declares_no_doc_ids_is_checked_causally_only():
    spec = AttentionBackendSpec(name="plain", summary="s", impl=f"{__name__}:_Causal")
    check_attention_backend(spec)
    check_attention_backend(_Causal, honours=())


@pytest.mark.numerical
@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (
            _WrongGqaHeads,
            r"4 query / 2 key-value heads, causal without doc_ids: forward .* differs from the reference",
        ),
        (_NotCausal, r"causal without doc_ids: forward .* differs from the reference"),
        (_FirstRowMask, r"document isolation broken at row 1, document 1"),
        (_Detached, "carries no gradient"),
        (_WrongBackward, r"grad of q \(with autograd\) differs from the reference"),
    ],
)
def test_broken_backends_fail_with_a_specific_message(backend, message):
    with pytest.raises(AssertionError, match=message):
        check_attention_backend(backend)


@pytest.mark.numerical
def test_correct_masked_backend_passes_and_mask_mod_restricts_the_reference():
    check_attention_backend(_Masked)
    with pytest.raises(AssertionError, match="differs from the reference"):
        check_attention_backend(_Masked, mask_mod=lambda q, kv: q - kv < 3)


@pytest.mark.numerical
def test_reference_attention_matches_sdpa_and_masks_documents():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_within_rounding(
        reference_attention(q, k, v), sdpa, dtype=torch.float64, terms=6, what="reference vs sdpa"
    )
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    out = reference_attention(q, k, v, doc_ids)
    # The second document alone is the same as the packed row's second half.
    alone = reference_attention(q[..., 3:, :], k[..., 3:, :], v[..., 3:, :])
    assert_within_rounding(out[..., 3:, :], alone, dtype=torch.float64, terms=6, what="second document")


@pytest.mark.numerical
def test_reference_attention_matches_the_builtin_eager_backend_with_gqa_and_doc_ids():
    from forge_core.testing import doc_ids_from_lengths
    from forge_plugins.attention.eager import EagerAttention

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, h, 16, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    doc_ids = doc_ids_from_lengths(((5, 1, 6, 4), (1, 9, 6)), 16)
    eager = EagerAttention(None)
    for ids in (None, doc_ids):
        got = eager.attend(q, k, v, eager.prepare(ids, 16, "cpu"))
        assert_within_rounding(
            got, reference_attention(q, k, v, ids), dtype=torch.float64, terms=16, what="eager"
        )


def test_unavailable_device_is_a_usage_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(ValueError, match="'cuda' is not available"):
        check_attention_backend("eager", devices=("cuda",))


# --- packers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "options", "emitted", "lossless"),
    [
        ("none", None, frozenset(), False),
        ("concat", None, frozenset({DOC_IDS, POSITIONS}), False),
        ("concat", {"isolate": False}, frozenset(), False),
        ("bfd", None, frozenset({DOC_IDS, POSITIONS}), True),
    ],
)
def test_builtin_packers_pass_the_kit(name, options, emitted, lossless):
    report = check_packer(name, options, lossless=lossless)
    assert report.emitted == emitted
    assert report.rows > 0 and 0.5 <= report.kept <= 1.0


def _mutating(base: str, mutate, emits=frozenset({DOC_IDS, POSITIONS}), emits_when=None, options=None):
    """A PackerSpec whose packer lays out rows as the built-in ``base`` does and whose
    materialized rows are then changed by ``mutate`` (through :func:`_mutated_rows`: a
    layout cannot break the per-token invariants the kernel computes, so the controls
    break the rows the kit reads)."""
    from forge_core.api import import_path

    base_cls = import_path(base)

    class Mutated:
        mutate_rows = staticmethod(mutate)

        def __init__(self, options, **kwargs):
            self.inner = base_cls(options, **kwargs)

        def layout(self, lengths):
            return self.inner.layout(lengths)

    return _park(Mutated, emits=emits, emits_when=emits_when, options=options)


@pytest.fixture
def _mutated_rows(monkeypatch):
    """The kit reads a packer's rows through ``_lazy_rows``; apply a mutant's change."""
    import forge_core.testing.packers as kit

    read = kit._lazy_rows

    def mutated(packer, *args):
        out = read(packer, *args)
        getattr(packer, "mutate_rows", lambda rows: None)(out)
        return out

    monkeypatch.setattr(kit, "_lazy_rows", mutated)


def _park(cls, emits=frozenset({DOC_IDS, POSITIONS}), emits_when=None, options=None):
    # Specs name their implementation by import path: park the class where one reaches it.
    attr = f"m{len(vars(_MUTANTS))}"
    setattr(_MUTANTS, attr, cls)
    kwargs = {"options": options} if options is not None else {}
    return PackerSpec(
        name="mutant",
        summary="s",
        impl=f"{__name__}:_MUTANTS.{attr}",
        emits=emits,
        emits_when=emits_when,
        **kwargs,
    )


def _lazy_mutant(base: str, change):
    """A lazy packer whose layout is the built-in ``base``'s, changed by ``change(layout, lengths)``."""
    from forge_core.api import import_path

    base_cls = import_path(base)

    class Mutated(base_cls):
        def layout(self, lengths):
            return change(super().layout(lengths), lengths)

    return _park(Mutated)


_MUTANTS = types.SimpleNamespace()
CONCAT = "forge_plugins.packers.concat:ConcatPacker"
BFD = "forge_plugins.packers.bfd:BfdPacker"


def _drop(*keys):
    def mutate(out):
        for key in keys:
            out.pop(key, None)

    return mutate


def _set_row_labels(out):
    out["labels"][:, :] = out["input_ids"][:, :]  # predict the current token


@attrs.frozen
class _Switch:
    isolate: bool = True


def _eos_labels_cross(out):
    # Put back the label of every EOS that is followed in its row: the next document's token.
    ids, labels = out["input_ids"], out["labels"]
    eos = np.flatnonzero((ids[:, :-1] == 1).reshape(-1))
    rows, cols = np.divmod(eos, ids.shape[1] - 1)
    labels[rows, cols] = ids[rows, cols + 1]


def _merge_documents(out):
    out["doc_ids"][:] = 0


def _eos_opens_the_next_document(out):
    # Counting EOS up to and including i (instead of strictly before i) moves every EOS
    # into the document that follows it.
    out["doc_ids"][:] = np.cumsum(out["input_ids"] == 1, axis=1)


def _positions_never_restart(out):
    out["positions"][:] = np.arange(out["positions"].shape[1])


def _duplicate_first_row(out):
    out["input_ids"][1] = out["input_ids"][0]
    out["labels"][1] = out["labels"][0]


def _int32(out):
    out["input_ids"] = out["input_ids"].astype(np.int32)


def _no_labels(out):
    out["labels"][:] = IGNORE_INDEX


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            _mutating(BFD, _drop(DOC_IDS, POSITIONS)),
            r"declares that it emits \{doc_ids, positions\}.*rows have no doc_ids, positions",
        ),
        (
            _mutating(BFD, lambda out: None, emits=frozenset()),
            "rows carry doc_ids, positions, which the spec does not declare",
        ),
        (
            _mutating(BFD, lambda out: None, emits_when="isolate", options=_Switch),
            r"with isolate=False: its rows carry doc_ids",
        ),
        (_mutating(CONCAT, _eos_labels_cross), "label must not cross a document boundary"),
        (_mutating(BFD, _merge_documents), "spans two documents"),
        (
            _mutating(CONCAT, _eos_opens_the_next_document),
            r"spans two documents \(an EOS of unknown document then document \d+ token 0\)",
        ),
        (_mutating(BFD, _positions_never_restart), "a new document starts .* not 0"),
        (_mutating(BFD, _duplicate_first_row), "appears twice"),
        (_mutating(BFD, _int32), "'input_ids' has dtype int32"),
        (_mutating(BFD, _no_labels), "label is -100 although the next token of the same document"),
        (_mutating(BFD, _set_row_labels), "is not the next token of the input's document"),
    ],
    ids=[
        "declared-not-emitted",
        "emitted-not-declared",
        "emits_when-ignored",
        "label-crosses",
        "merged-doc-ids",
        "eos-in-next-doc",
        "positions",
        "duplicate",
        "dtype",
        "no-labels",
        "wrong-labels",
    ],
)
def test_broken_packers_fail_with_a_specific_message(spec, message, _mutated_rows):
    with pytest.raises(AssertionError, match=message):
        check_packer(spec)


def _overlap(layout, lengths):
    return attrs.evolve(layout, starts=np.minimum(layout.starts + 1, layout.starts.max()))


def _no_metadata(layout, lengths):
    return attrs.evolve(layout, metadata=False)


def _mutates_lengths(layout, lengths):
    lengths[:] = 0
    return layout


_CALLS = iter(range(10**6))


def _changes_every_call(layout, lengths):
    """Every other call, the same rows in reverse order: a valid layout, but another one."""
    if next(_CALLS) % 2 == 0:
        return layout
    per_row = np.diff(layout.row_ptr)
    row = np.repeat(np.arange(layout.rows), per_row)
    order = np.lexsort((np.arange(layout.num_pieces), -row))
    return attrs.evolve(
        layout,
        starts=layout.starts[order],
        lengths=layout.lengths[order],
        row_ptr=np.concatenate([[0], np.cumsum(per_row[::-1])]),
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_lazy_mutant(BFD, _overlap), "layout\\(\\) broke the packer contract: pieces overlap"),
        (
            _lazy_mutant(BFD, _no_metadata),
            r"declares that it emits \{doc_ids, positions\}.*rows have no doc_ids",
        ),
        (_lazy_mutant(BFD, _mutates_lengths), "layout\\(\\) modified the lengths it was given"),
        (_lazy_mutant(BFD, _changes_every_call), "twice gave different results"),
    ],
    ids=["overlap", "metadata-off", "mutates-lengths", "nondeterministic"],
)
def test_broken_lazy_packers_fail_with_a_specific_message(spec, message):
    with pytest.raises(AssertionError, match=message):
        check_packer(spec)


def test_an_unmutated_mutant_passes(_mutated_rows):
    """The controls above fail only through their mutation."""
    report = check_packer(_mutating(BFD, lambda out: None), lossless=True)
    assert report.emitted == {DOC_IDS, POSITIONS}


def test_a_packer_with_only_the_old_pack_contract_is_refused_naming_layout():
    class Old:
        def __init__(self, options, **kwargs):
            pass

        def pack(self, documents):
            return {}

    with pytest.raises(AssertionError, match=r"no layout\(lengths\).*pack\(documents\).*is gone"):
        check_packer(_park(Old))


def test_lossless_is_enforced_when_asked():
    check_packer("concat")
    with pytest.raises(AssertionError, match="not lossless"):
        check_packer("concat", lossless=True)  # concat drops the last partial window


def test_packer_class_without_spec_declares_only_what_emits_says():
    from forge_plugins.packers.bfd import BfdPacker

    check_packer(BfdPacker, emits={DOC_IDS, POSITIONS})
    with pytest.raises(AssertionError, match="does not declare"):
        check_packer(BfdPacker)


# --- rules ------------------------------------------------------------------------------


def test_builtin_rules_pass_the_kit():
    from forge_core.api import ParallelismSpec, hookimpl

    class Lossy:  # a third-party wrapper that declares it forwards no metadata
        @hookimpl
        def forge_parallelisms(self):
            return [
                ParallelismSpec(
                    name="lossy",
                    summary="drops metadata",
                    impl="x.y:Z",
                    mesh_dim=None,
                    order=350,
                    forwards=frozenset(),
                )
            ]

    messages = check_rule(
        "parallel.metadata-reaches-layers",
        violating={"parallel": {"wrappers": ["lossy"]}, "data": {"packer": "concat"}},
        passing=[
            {
                "parallel": {"wrappers": ["lossy"]},
                "data": {"packer": "concat", "packer_options": {"isolate": False}},
            },
            {"parallel": {"pp": 2}, "data": {"packer": "concat"}},  # the pipeline carries the metadata
            {"data": {"packer": "bfd"}},
        ],
        extra_plugins=[("lossyplug", Lossy())],
    )
    assert "doc_ids" in messages[0] and "'lossy'" in messages[0]
    check_rule("model.seq-len", violating=({}, ["data.seq_len=1000000"]), passing={})
    check_rule(
        "parallel.world-size",
        violating={"parallel": {"dp_shard": 3}},
        passing={"parallel": {"dp_shard": 2}},
        world_size=2,
    )


def _never(ctx):
    return None


def _always(ctx):
    return "always wrong"


def _raises(ctx):
    raise KeyError("oops")


def _window_too_big(ctx):
    if ctx.config.data.seq_len > 128:
        return f"data.seq_len = {ctx.config.data.seq_len} is above 128"
    return None


def _rule(check, paths=("data.seq_len",), fix="Lower data.seq_len."):
    return Rule(id="test.rule", severity="error", paths=paths, summary="A test rule.", check=check, fix=fix)


def test_rule_object_is_checked_on_both_configs():
    messages = check_rule(
        _rule(_window_too_big), violating={"data": {"seq_len": 256}}, passing={"data": {"seq_len": 64}}
    )
    assert messages == ["data.seq_len = 256 is above 128"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (_rule(_never), "on the violating config .*did not fire"),
        (_rule(_always), "on the passing config .*fired although the config is fine: always wrong"),
        (_rule(_raises), "the rule raised KeyError"),
        (
            _rule(_window_too_big, paths=("data.seqlen",)),
            "names the field 'data.seqlen', which the config does not have",
        ),
        (_rule(_window_too_big, fix=" "), "has an empty fix"),
        (_rule(lambda ctx: [""]), "every message must be a non-empty string"),
    ],
    ids=["never-fires", "always-fires", "raises", "unknown-path", "empty-fix", "empty-message"],
)
def test_broken_rules_fail_with_a_specific_message(rule, message):
    with pytest.raises(AssertionError, match=message):
        check_rule(rule, violating={"data": {"seq_len": 256}}, passing={"data": {"seq_len": 64}})


def test_config_that_does_not_load_is_reported_not_counted_as_firing():
    with pytest.raises(AssertionError, match=r"(?s)does not load.*unknown key 'seq_lenn'"):
        check_rule(_rule(_always), violating={"data": {"seq_lenn": 1}}, passing={})


class _WindowPlugin:
    """A plugin registered in process: a backend with a rule about its option."""

    @hookimpl
    def forge_attention_backends(self):
        return [
            AttentionBackendSpec(
                name="kitwin", summary="s", impl=f"{__name__}:_Masked", options=_WinOptions, honours={DOC_IDS}
            )
        ]

    @hookimpl
    def forge_rules(self):
        return [
            Rule(
                id="kitwin.small",
                severity="warning",
                paths=("attention.options.window",),
                summary="s",
                check=lambda ctx: (
                    "too big"
                    if ctx.specs["attention"].name == "kitwin" and ctx.config.attention.options.window > 8
                    else None
                ),
                fix="f",
            )
        ]


@attrs.frozen
class _WinOptions:
    window: int = 4


def test_rule_of_an_in_process_plugin_by_id_with_overrides():
    plugin = (("kitwin", _WindowPlugin()),)
    check_rule(
        "kitwin.small",
        violating=({"attention": {"backend": "kitwin"}}, ["attention.options.window=16"]),
        passing=[{"attention": {"backend": "kitwin"}}, {}],
        extra_plugins=plugin,
    )
    check_attention_backend("kitwin", options={"window": 2}, extra_plugins=plugin)
    with pytest.raises(ValueError, match=r"invalid options .*window.*expected an integer"):
        check_attention_backend("kitwin", options={"window": "x"}, extra_plugins=plugin)


# --- packaging --------------------------------------------------------------------------


def test_pytest_plugin_fixtures(forge_conformance, forge_registries, forge_config, forge_devices):
    assert forge_conformance.check_packer is check_packer
    assert "bfd" in forge_registries["packer"]
    assert forge_devices == ("cpu",)
    forge_conformance.check_rule(
        "model.seq-len", violating=forge_config({"data": {"seq_len": 10**6}}), passing=forge_config({})
    )


class _CountsCausalPairs(_Masked):
    """Counts the pairs of plain causal attention, even with doc_ids (its mask isolates)."""

    def attended_pairs(self, doc_ids, rows, seq_len):
        return rows * seq_len * (seq_len + 1) // 2


class _ShardsQueriesWithoutDocuments(_Masked):
    """Masks a share of the queries causally against the whole row, ignoring doc_ids."""

    def prepare_queries(self, doc_ids, query_index, seq_len, device):
        return (torch.arange(seq_len, device=device)[None, None, :] <= query_index[:, :, None])[:, None]


@pytest.mark.numerical
def test_kit_checks_the_optional_capabilities_an_attention_backend_has():
    class Counts(_Masked):
        def attended_pairs(self, doc_ids, rows, seq_len):
            mask = self.prepare(doc_ids, seq_len, "cpu")
            return int(mask.expand(rows, 1, seq_len, seq_len).sum())

    class Shards(_Masked):
        def prepare_queries(self, doc_ids, query_index, seq_len, device):
            return self.prepare(doc_ids, seq_len, device).expand(query_index.shape[0], 1, seq_len, seq_len)[
                :, :, query_index[0]
            ]

    check_attention_backend(Counts)
    check_attention_backend(Shards)
    with pytest.raises(
        AssertionError, match=r"attended_pairs\(document ids, 2, 16\) returned 272, but its mask allows"
    ):
        check_attention_backend(_CountsCausalPairs)
    with pytest.raises(
        AssertionError, match=r"prepare_queries\(doc_ids, query_index, seq_len, device\) for the"
    ):
        check_attention_backend(_ShardsQueriesWithoutDocuments)
