"""The conformance kit (forge_core.testing): the built-in packers and rules pass it, and it
fails, with a message naming the problem, on deliberately broken components. The built-in
attention backends are run through it in test_attention.py (on multi-block rows)."""

from __future__ import annotations

import subprocess
import sys
import types

import attrs
import numpy as np
import pytest

from conftest import REPO
from forge_core.hookspecs import hookimpl
from forge_core.rules import Rule
from forge_core.specs import DOC_IDS, POSITIONS, AttentionBackendSpec, PackerSpec
from forge_core.testing import check_packer, check_rule

torch = pytest.importorskip("torch")
F = torch.nn.functional

from forge_core.testing import check_attention_backend, reference_attention  # noqa: E402


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
        return F.scaled_dot_product_attention(q, k, v, attn_mask=prepared, enable_gqa=q.shape[1] != k.shape[1])


class _WrongGqaHeads(_Masked):
    """Maps query heads to key/value heads round-robin (repeat) instead of in groups."""

    def attend(self, q, k, v, prepared):
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), attn_mask=prepared)


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


def test_backend_ignoring_doc_ids_fails_document_isolation():
    with pytest.raises(AssertionError, match=r"document isolation broken at row 0, document 1 .*attend across documents"):
        check_attention_backend(_Causal)


def test_reference_agreement_with_doc_ids_catches_ignored_doc_ids_on_its_own():
    # The kit runs isolation first, and isolation catches this backend; agreement with the
    # reference under doc_ids must catch it too, so that neither check hides behind the other.
    from forge_core.testing.attention import LAYOUTS, _Case, doc_ids_from_lengths

    case = _Case(_Causal(None), "cpu", torch.float32, 4, 2, 0, None, {"atol": 1e-4, "rtol": 1e-4}, "ignores", LAYOUTS)
    case.agrees_with_reference(doc_ids=None)
    with pytest.raises(AssertionError, match=r"causal with doc_ids: forward .* differs from the reference"):
        case.agrees_with_reference(doc_ids=doc_ids_from_lengths(LAYOUTS, 16))


def test_kit_catches_a_small_numerical_error():
    with pytest.raises(AssertionError, match=r"causal without doc_ids: forward \(no_grad, call 1 .* differs from the reference"):
        check_attention_backend(_WrongScale)


def test_layouts_reach_the_checks():
    check_attention_backend(_LeaksAfterFirstBlock)  # default rows are 16 tokens: no leak
    with pytest.raises(AssertionError, match=r"document isolation broken at row 0, document 3 \(positions 12\.\.22 of 24\)"):
        check_attention_backend(_LeaksAfterFirstBlock, layouts=((5, 1, 6, 11, 1), (1, 9, 14)))
    with pytest.raises(ValueError, match=r"document lengths \(4,\) must be positive and add up to seq_len 5"):
        check_attention_backend("eager", layouts=((3, 2), (4,)))
    with pytest.raises(ValueError, match="must be positive"):
        check_attention_backend("eager", layouts=((3, 0, 2),))


def test_backend_ignoring_doc_ids_fails_when_its_spec_declares_it_honours_them():
    spec = AttentionBackendSpec(name="liar", summary="s", impl=f"{__name__}:_Causal", honours={DOC_IDS})
    with pytest.raises(AssertionError, match="attention 'liar'.*document isolation broken"):
        check_attention_backend(spec)


def test_backend_that_declares_no_doc_ids_is_checked_causally_only():
    spec = AttentionBackendSpec(name="plain", summary="s", impl=f"{__name__}:_Causal")
    check_attention_backend(spec)
    check_attention_backend(_Causal, honours=())


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (_WrongGqaHeads, r"4 query / 2 key-value heads, causal without doc_ids: forward .* differs from the reference"),
        (_NotCausal, r"causal without doc_ids: forward .* differs from the reference"),
        (_FirstRowMask, r"document isolation broken at row 1, document 1"),
        (_Detached, "carries no gradient"),
        (_WrongBackward, r"grad of q \(with autograd\) differs from the reference"),
    ],
)
def test_broken_backends_fail_with_a_specific_message(backend, message):
    with pytest.raises(AssertionError, match=message):
        check_attention_backend(backend)


def test_correct_masked_backend_passes_and_mask_mod_restricts_the_reference():
    check_attention_backend(_Masked)
    with pytest.raises(AssertionError, match="differs from the reference"):
        check_attention_backend(_Masked, mask_mod=lambda q, kv: q - kv < 3)


def test_reference_attention_matches_sdpa_and_masks_documents():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    torch.testing.assert_close(reference_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    out = reference_attention(q, k, v, doc_ids)
    # The second document alone is the same as the packed row's second half.
    torch.testing.assert_close(out[..., 3:, :], reference_attention(q[..., 3:, :], k[..., 3:, :], v[..., 3:, :]))


def test_reference_attention_matches_the_builtin_eager_backend_with_gqa_and_doc_ids():
    from forge_core.testing import doc_ids_from_lengths
    from forge_plugins.attention.eager import EagerAttention

    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(2, 4, 16, 8, generator=g), torch.randn(2, 2, 16, 8, generator=g), torch.randn(2, 2, 16, 8, generator=g)
    doc_ids = doc_ids_from_lengths(((5, 1, 6, 4), (1, 9, 6)), 16)
    eager = EagerAttention(None)
    for ids in (None, doc_ids):
        torch.testing.assert_close(reference_attention(q, k, v, ids), eager.attend(q, k, v, eager.prepare(ids, 16, "cpu")))


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
    """A PackerSpec whose packer is the built-in ``base`` with its output mutated."""
    from forge_core.specs import import_path

    base_cls = import_path(base)

    class Mutated(base_cls):
        def pack(self, documents):
            out = super().pack(documents)
            mutate(out)
            return out

    # Specs name their implementation by import path: park the class where one reaches it.
    attr = f"m{len(vars(_MUTANTS))}"
    setattr(_MUTANTS, attr, Mutated)
    kwargs = {"options": options} if options is not None else {}
    return PackerSpec(name="mutant", summary="s", impl=f"{__name__}:_MUTANTS.{attr}", emits=emits, emits_when=emits_when, **kwargs)


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
    out["labels"][:] = -100


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_mutating(BFD, _drop(DOC_IDS, POSITIONS)), r"declares that it emits \{doc_ids, positions\}.*returned no doc_ids, positions"),
        (_mutating(BFD, lambda out: None, emits=frozenset()), "returned doc_ids, positions, which the spec does not declare"),
        (_mutating(BFD, lambda out: None, emits_when="isolate", options=_Switch), r"with isolate=False: pack\(\) returned doc_ids"),
        (_mutating(CONCAT, _eos_labels_cross), "label must not cross a document boundary"),
        (_mutating(BFD, _merge_documents), "spans two documents"),
        (_mutating(CONCAT, _eos_opens_the_next_document), r"spans two documents \(an EOS of unknown document then document \d+ token 0\)"),
        (_mutating(BFD, _positions_never_restart), "a new document starts .* not 0"),
        (_mutating(BFD, _duplicate_first_row), "appears twice"),
        (_mutating(BFD, _int32), "'input_ids' has dtype int32"),
        (_mutating(BFD, _no_labels), "label is -100 although the next token of the same document"),
        (_mutating(BFD, _set_row_labels), "is not the next token of the input's document"),
    ],
    ids=["declared-not-emitted", "emitted-not-declared", "emits_when-ignored", "label-crosses",
         "merged-doc-ids", "eos-in-next-doc", "positions", "duplicate", "dtype", "no-labels", "wrong-labels"],
)
def test_broken_packers_fail_with_a_specific_message(spec, message):
    with pytest.raises(AssertionError, match=message):
        check_packer(spec)


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
    messages = check_rule(
        "parallel.metadata-reaches-layers",
        violating={"parallel": {"pp": 2}, "data": {"packer": "concat"}},
        passing=[
            {"parallel": {"pp": 2}, "data": {"packer": "concat", "packer_options": {"isolate": False}}},
            {"data": {"packer": "bfd"}},
        ],
    )
    assert "doc_ids" in messages[0]
    check_rule("model.seq-len", violating=({}, ["data.seq_len=1000000"]), passing={})
    check_rule(
        "parallel.world-size", violating={"parallel": {"dp_shard": 3}}, passing={"parallel": {"dp_shard": 2}}, world_size=2
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
    messages = check_rule(_rule(_window_too_big), violating={"data": {"seq_len": 256}}, passing={"data": {"seq_len": 64}})
    assert messages == ["data.seq_len = 256 is above 128"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (_rule(_never), "on the violating config .*did not fire"),
        (_rule(_always), "on the passing config .*fired although the config is fine: always wrong"),
        (_rule(_raises), "the rule raised KeyError"),
        (_rule(_window_too_big, paths=("data.seqlen",)), "names the field 'data.seqlen', which the config does not have"),
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
        return [AttentionBackendSpec(name="kitwin", summary="s", impl=f"{__name__}:_Masked", options=_WinOptions, honours={DOC_IDS})]

    @hookimpl
    def forge_rules(self):
        return [Rule(id="kitwin.small", severity="warning", paths=("attention.options.window",), summary="s",
                     check=lambda ctx: "too big" if ctx.specs["attention"].name == "kitwin" and ctx.config.attention.options.window > 8 else None,
                     fix="f")]


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


def test_kit_and_pytest_plugin_import_without_torch():
    code = (
        "import sys, forge_core.testing, forge_core.testing.pytest_plugin\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.strip() == "False"


def test_pytest_plugin_fixtures(forge_conformance, forge_registries, forge_config, forge_devices):
    assert forge_conformance.check_packer is check_packer
    assert "bfd" in forge_registries["packer"]
    assert forge_devices == ("cpu",)
    forge_conformance.check_rule("model.seq-len", violating=forge_config({"data": {"seq_len": 10**6}}), passing=forge_config({}))
