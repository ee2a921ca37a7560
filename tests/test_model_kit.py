"""The conformance kit's model check (forge_core.testing.check_model): the built-in llama
and a third-party-style decoder pass it with every built-in attention backend, and each
deliberate flaw of the decoder (tests/kit_models.py) fails with its own message."""

from __future__ import annotations

import kit_models
import pytest
import torch

from forge_core.testing import check_model

#: Small llama options: a large init so that a leak shows.
TINY_LLAMA = {"dim": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64, "init_std": 0.3}
#: What a dense model's report skips.
NO_EXPERTS = "the model's contract names no experts (ParallelContract.experts): no mixture of experts"
DENSE = {"routing": NO_EXPERTS, "expert_parallel": NO_EXPERTS}

needs_compiled_flex = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
    reason="compiled FlexAttention needs AVX2 on CPU "
    f"(capability here: {torch.backends.cpu.get_cpu_capability()})",
)


@pytest.mark.numerical
def test_llama_passes_every_check():
    report = check_model("llama", options=TINY_LLAMA)
    assert report.checked == (
        "backend",
        "isolation",
        "tensor_parallel",
        "pipeline[2]",
        "pipeline[3]",
        "facts",
    )
    assert report.skipped == DENSE and max(report.worst.values()) < 1
    assert report.facts == {
        "heads": 4,
        "kv_heads": 2,
        "attend_calls": 3,
        "prepare_calls": 1,
        "blocks": 3,
        "tied_embeddings": False,
    }


@pytest.mark.numerical
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral", "olmo2"])
def test_every_llama_family_passes_every_check(family):
    """qwen3's per-head q/k norms must be declared in its tensor-parallel plan (partial),
    and only there: the plain llama's plan naming them would be a stale path; olmo2's
    post-norms and whole-projection q/k norms are placed by its plan too."""
    report = check_model("llama", options={**TINY_LLAMA, "family": family})
    assert report.skipped == DENSE and "tensor_parallel" in report.checked


@pytest.mark.numerical
@pytest.mark.parametrize("tied", [False, True])
def test_third_party_decoder_passes_every_check(tied):
    report = check_model(kit_models.spec(), options={"tied": tied}, dtypes=("float64", "float32"))
    assert report.skipped == DENSE and "pipeline[3]" in report.checked
    assert report.facts["tied_embeddings"] is tied


@pytest.mark.numerical
def test_llama_moe_passes_every_check_including_routing():
    # Block 1 of 3 is MoE (sigmoid top-2, renormalised: the kit checks the weights' sum).
    moe = {"num_experts": 4, "top_k": 2, "expert_hidden": 16, "every": 2, "shared_experts": 1}
    options = {
        **TINY_LLAMA,
        "moe": {**moe, "router": "sigmoid", "normalize_weights": True, "route_scale": 2.0},
    }
    report = check_model("llama", options=options)
    assert report.skipped == {} and max(report.worst.values()) < 1
    assert {"routing", "expert_parallel"} <= set(report.checked)


@pytest.mark.numerical
def test_third_party_moe_decoder_passes_every_check():
    checks = ("backend", "routing", "expert_parallel", "isolation", "tensor_parallel", "facts")
    report = check_model(kit_models.spec(), options={"experts": 4}, checks=checks)
    assert report.checked == checks and report.skipped == {}


@pytest.mark.numerical
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_models_pass_with_the_builtin_backends_in_float64(backend):
    for model, options in (("llama", TINY_LLAMA), (kit_models.spec(), None)):
        report = check_model(
            model, options=options, attention=backend, checks=("backend", "isolation", "pipeline")
        )
        assert max(report.worst.values()) < 1


@pytest.mark.numerical
@needs_compiled_flex
def test_models_pass_with_compiled_flex_in_float32():
    # Compiled CPU flex has no float64 kernel; documents alone run at the packed shape.
    for model, options in (("llama", TINY_LLAMA), (kit_models.spec(), None)):
        report = check_model(
            model,
            options=options,
            attention="flex",
            attention_options={"block_size": 16},
            dtypes=("float32",),
            standalone="prefix",
            checks=("backend", "isolation"),
        )
        assert report.worst["isolation"] < 1


#: Every deliberate flaw of kit_models.Decoder and the message it must fail with.
FLAW_MESSAGES = dict(
    [
        ("own_attention", r"never called attend\(\) of the attention backend the model was built with"),
        (
            "prepare_without_doc_ids",
            r"received doc_ids \(2, 24\) but called attention.prepare\(\) with doc_ids \[None\]",
        ),
        (
            "build_forward_needs_metadata",
            r"the trainer's build-time forward failed: model\(input_ids of shape \(1, 4\)\) "
            r"without doc_ids/positions, under torch.no_grad\(\), raised TypeError",
        ),
        (
            "shifts_across_documents",
            r"document isolation broken: float64: row 0 document 1 \(tokens 5:6\): packed "
            r"logits differ from the document run alone",
        ),
        (
            "plan_misses_q_norm",
            r"tensor-parallel plan \(sequence_parallel=False\): parameter\(s\) "
            r"stack.0.mix.q_norm.weight, stack.1.mix.q_norm.weight, stack.2.mix.q_norm.weight are "
            r"neither sharded by a style nor declared `replicated` or `partial`",
        ),
        (
            "plan_stale_path",
            r"its block scope's styles name 'attention.wq', which block\(s\) stack.0, stack.1, stack.2 "
            r"do not hold",
        ),
        (
            "stage_crash",
            r"pipeline stage 1 of 2 \(blocks 2, given hidden states\) raised TypeError: 'NoneType' object "
            r"is not callable when called with hidden states \(2, 24, 16\) and the doc_ids and positions "
            r"keywords. The stage forward contract: a pipeline stage is a shallow copy",
        ),
        (
            "stage_drops_doc_ids",
            r"2 pipeline stages run in sequence differ from the unsplit model on packed rows.*"
            r"Does every stage build its mask from the doc_ids keyword",
        ),
        ("wrong_facts", r"facts\(options\) disagree with the built model: heads 8 \(the model has 4\)"),
        (
            "supports_without_split",
            r"declares supports \['blocks', 'output_head', 'pipeline', 'sequence_parallel', "
            r"'tensor_parallel'\] but parallel_contract\(\) does not supply \['pipeline'\]",
        ),
        (
            # check refuses sequence parallelism only for a model that leaves it out of supports
            "refuses_sequence_parallel",
            r"declares supports \[.*'sequence_parallel'.*\] but parallel_contract\(\) does not supply "
            r"\['sequence_parallel'\]",
        ),
        (
            "forward_names_tokens",
            r"does not meet the model contract \(forge_core.api.Model\): forward\(tokens, doc_ids=None, "
            r"positions=None\) does not take input_ids as keyword argument\(s\)",
        ),
        (
            "forward_without_positions",
            r"forward\(input_ids, doc_ids=None\) does not take positions as keyword argument\(s\), which "
            r"the trainer passes .* the spec's accepts: \['doc_ids', 'positions'\]",
        ),
        ("misroutes", r"the dispatcher's result is not each token's weighted sum of its experts' compute"),
        (
            "experts_by_global_index",
            r"routed experts split over an expert-parallel group of 2: the forward raised IndexError.*"
            r"compute\(x_grouped, counts\) must read its experts by local index",
        ),
        (
            "duplicate_experts",
            r"token 0 is routed to experts \[\d, \d\]: each token's experts must be distinct",
        ),
        (
            "head_not_linear",
            r"parallel_contract\(\).output_head is 'final_norm', which is not an attribute of the "
            r"model with a 2-D weight",
        ),
    ]
)


def test_every_flaw_has_a_negative_control():
    assert set(FLAW_MESSAGES) == set(kit_models.FLAWS)


@pytest.mark.parametrize(("flaw", "message"), FLAW_MESSAGES.items())
def test_each_flaw_fails_with_its_message(flaw, message):
    with pytest.raises(AssertionError, match=r"^model 'kitdecoder': .*" + message):
        check_model(kit_models.spec(), options={"flaw": flaw})


def test_a_bare_factory_is_checked_without_spec_facts():
    report = check_model(
        kit_models.build, options=kit_models.KitOptions(), checks=("backend", "facts", "tensor_parallel")
    )
    assert report.checked == ("backend", "tensor_parallel")
    assert report.skipped == {
        "facts": "no spec (the model was given as a factory): facts and supports not checked"
    }


def test_kit_misuse_is_a_value_error():
    with pytest.raises(ValueError, match=r"unknown check\(s\) \['speed'\]"):
        check_model("llama", checks=("speed",))
    with pytest.raises(ValueError, match="invalid options for model 'llama'"):
        check_model("llama", options={"n_layers": 0})


def test_the_fixture_carries_check_model(forge_conformance):
    assert forge_conformance.check_model is check_model


class _FunctionalEmbedding(torch.nn.Module):
    """Embeds with torch.nn.functional.embedding: the kit sees no embedding output."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(50, 8))
        self.out = torch.nn.Linear(8, 50)

    def forward(self, input_ids, doc_ids=None, positions=None):
        return self.out(torch.nn.functional.embedding(input_ids, self.table))


def test_isolation_refuses_a_model_whose_embedding_outputs_it_cannot_see():
    """The exactly-zero gradient check needs the embedding outputs: a model that gives
    none is refused, not passed with that check skipped."""
    from forge_core.testing.isolation import check_document_isolation

    with pytest.raises(AssertionError, match="no nn.Embedding output of the batch's shape"):
        check_document_isolation(_FunctionalEmbedding(), dtypes=(torch.float64,))


def test_a_model_that_may_be_built_on_meta_without_init_weights_fails_the_kit():
    with pytest.raises(AssertionError, match=r"pretrained_option 'flaw', .* no init_weights\(\)"):
        check_model(kit_models.spec(pretrained_option="flaw"))


def test_the_contract_gaps_name_each_missing_protocol():
    from forge_core.api import CachingModel, Model, ModelSpec, ParallelModule, model_contract_gaps

    class Bare:
        def forward(self, input_ids):
            return input_ids

        def new_cache(self, batch_size, max_len):
            return None

    spec = ModelSpec(name="bare", summary="s", impl="m:f", accepts={"doc_ids"}, supports={"blocks"})
    gaps = model_contract_gaps(Bare(), spec)
    assert [g.split("(the ")[-1] for g in gaps[1:]] == ["ParallelModule protocol)", "CachingModel protocol)"]
    assert "does not take doc_ids" in gaps[0]
    assert (
        isinstance(Bare(), Model)
        and isinstance(Bare(), CachingModel)
        and not isinstance(Bare(), ParallelModule)
    )
    (only,) = model_contract_gaps(Bare(), None)  # no spec: only what the module itself shows
    assert only.startswith(
        "it has new_cache() but its forward takes no attention_mask, cache, positions keyword"
    )
