"""The contract between a model and the parallelism strategies, judged and applied
without a process group: what the spec declares (``supports``, ``facts``) and how the
rules read it; what the implementation supplies (``parallel_contract()``) and how the
strategies find blocks, check a tensor-parallel plan's coverage and re-tie tied weights.
The same contract under real process groups: tests/distributed/."""

from __future__ import annotations

import attrs
import pytest
import torch

from forge_core.api import (
    BLOCKS,
    OUTPUT_HEAD,
    PIPELINE,
    ROLES,
    SEQUENCE_PARALLEL,
    TENSOR_PARALLEL,
    ForgeError,
    ModelFacts,
    ModelSpec,
    ParallelContract,
    TensorParallelPlan,
    TensorParallelScope,
    blocks_of,
    contract_of,
    hookimpl,
)
from forge_core.judge import judge

#: An importable implementation: these specs are judged, never built.
IMPL = "forge_plugins.models.llama:build"


@attrs.frozen
class OtherOptions:
    """A model whose options do not use llama's names."""

    num_hidden_layers: int = 4
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    max_seq_len: int = 128


def other_facts(options: OtherOptions) -> ModelFacts:
    return ModelFacts(
        blocks=options.num_hidden_layers,
        heads=options.num_attention_heads,
        kv_heads=options.num_key_value_heads,
    )


class ThirdPartyModels:
    """Registered in process (``extra_plugins``), as ``forge-run`` would find a package."""

    @hookimpl
    def forge_models(self):
        return [
            ModelSpec(
                name="blocks_only",
                summary="declares blocks, no TP plan or split",
                impl=IMPL,
                options=OtherOptions,
                supports={BLOCKS},
                facts=other_facts,
            ),
            ModelSpec(
                name="renamed",
                summary="supports everything, options named otherwise",
                impl=IMPL,
                options=OtherOptions,
                supports={BLOCKS, TENSOR_PARALLEL, PIPELINE},
                facts=other_facts,
            ),
            ModelSpec(
                name="factless",
                summary="supports everything, declares no facts",
                impl=IMPL,
                options=OtherOptions,
                supports={BLOCKS, TENSOR_PARALLEL, PIPELINE},
            ),
        ]


EXTRA = (("thirdparty", ThirdPartyModels()),)


def judged(cfg, model, parallel, world_size):
    path = cfg(
        {
            "model": {"name": model},
            "data": {"packer": "none", "seq_len": 64},
            "parallel": {"dp_shard": 1, **parallel},
        }
    )
    result = judge(path, [], world_size, extra_plugins=EXTRA)
    found: dict[str, list[str]] = {}
    for v in result.errors:
        found.setdefault(v.rule_id, []).append(v.message)
    return found, result


# --- what check judges -------------------------------------------------------------------


def test_a_strategy_the_model_does_not_declare_is_refused_at_check(forge_config):
    found, result = judged(forge_config, "blocks_only", {"tp": 2}, 2)
    (message,) = found["parallel.model-supports-strategy"]
    assert "strategy 'tp' needs the model to supply tensor_parallel" in message
    assert "model 'blocks_only' does not declare it (its spec supports: blocks)" in message
    assert "parallel.tp: 1" in message  # the fix in the message itself
    (violation,) = [v for v in result.errors if v.rule_id == "parallel.model-supports-strategy"]
    assert "ModelSpec.supports" in violation.fix and ("model.name", "blocks_only") in violation.fields
    # The strategy's own rules stay silent: the one reason is reported once.
    assert "tp.heads-divisible" not in found
    found, _ = judged(forge_config, "blocks_only", {"pp": 2}, 2)
    assert "strategy 'pp' needs the model to supply pipeline" in found["parallel.model-supports-strategy"][0]


def test_strategies_that_require_nothing_and_models_that_support_everything_pass(forge_config):
    found, _ = judged(forge_config, "blocks_only", {"dp_shard": 2}, 2)  # fsdp shards any model
    assert "parallel.model-supports-strategy" not in found
    for model in ("renamed", "llama"):
        found, _ = judged(forge_config, model, {"tp": 2}, 2)
        assert "parallel.model-supports-strategy" not in found, model


def test_sequence_parallel_for_a_model_that_does_not_declare_it_is_refused_at_check(forge_config):
    # Before: check said valid, and the run stopped at build (the model's plan refusing
    # sequence_parallel=True) after every process had started.
    sp = {"tp": 2, "options": {"tp": {"sequence_parallel": True}}}
    found, result = judged(forge_config, "renamed", sp, 2)
    (message,) = found["tp.model-supports-sequence-parallel"]
    assert "model 'renamed' does not declare sequence_parallel" in message
    (violation,) = [v for v in result.errors if v.rule_id == "tp.model-supports-sequence-parallel"]
    assert ("parallel.options.tp.sequence_parallel", True) in violation.fields
    assert "sequence_parallel: false" in violation.fix and "SEQUENCE_PARALLEL" in violation.fix
    found, _ = judged(forge_config, "llama", sp, 2)  # the built-in model declares it
    assert not found
    found, _ = judged(forge_config, "renamed", {"tp": 2}, 2)  # tensor parallelism alone
    assert "tp.model-supports-sequence-parallel" not in found
    # Without tensor parallelism at all, the kernel's rule speaks, once.
    found, _ = judged(forge_config, "blocks_only", sp, 2)
    assert "tp.model-supports-sequence-parallel" not in found and "parallel.model-supports-strategy" in found


def test_the_head_rule_reads_the_declared_facts_whatever_the_options_are_called(forge_config):
    found, _ = judged(forge_config, "renamed", {"tp": 4}, 4)
    assert found["tp.heads-divisible"] == [
        "model 'renamed' has 6 query heads, not divisible by parallel.tp = 4: tensor parallelism gives "
        "every rank whole attention heads (q/k/v are split by columns)",
        "model 'renamed' has 2 key/value heads, not divisible by parallel.tp = 4: tensor parallelism gives "
        "every rank whole attention heads (q/k/v are split by columns)",
    ]
    found, _ = judged(forge_config, "renamed", {"tp": 2}, 2)
    assert "tp.heads-divisible" not in found


def test_the_pipeline_rules_read_the_declared_facts(forge_config):
    found, _ = judged(forge_config, "renamed", {"pp": 8}, 8)
    assert "model 'renamed' has 4 layers, fewer than the 8 pipeline stages" in found["pp.layers"][0]
    found, result = judged(forge_config, "llama", {"pp": 2}, 2)
    assert "pp.tied-embeddings" not in found
    path = forge_config(
        {
            "model": {"options": {"tie_embeddings": True}},
            "parallel": {"pp": 2, "dp_shard": 1},
            "data": {"packer": "none"},
        }
    )
    tied = {v.rule_id: v.message for v in judge(path, [], 2).errors}
    assert "model 'llama' ties its input and output embeddings" in tied["pp.tied-embeddings"]


def test_a_model_without_facts_is_refused_where_a_rule_needs_them(forge_config):
    found, _ = judged(forge_config, "factless", {"tp": 2}, 2)
    assert "model 'factless' declares no facts (ModelSpec.facts)" in found["tp.heads-divisible"][0]
    found, _ = judged(forge_config, "factless", {"pp": 2}, 2)
    assert "model 'factless' declares no facts" in found["pp.layers"][0]
    found, _ = judged(forge_config, "factless", {}, 1)  # no strategy needs them: nothing to say
    assert not found


def test_the_plan_carries_the_facts_once(forge_config):
    _, result = judged(forge_config, "renamed", {}, 1)
    assert result.plan.facts == ModelFacts(blocks=4, heads=6, kv_heads=2)
    _, result = judged(forge_config, "llama", {}, 1)
    assert result.plan.facts == ModelFacts(
        blocks=4, heads=8, kv_heads=4, tied_embeddings=False, roles=frozenset(ROLES)
    )


def test_a_facts_function_that_raises_names_its_plugin(forge_config):
    class Broken:
        @hookimpl
        def forge_models(self):
            def facts(options):
                raise RuntimeError("boom")

            return [
                ModelSpec(name="broken", summary="facts raise", impl=IMPL, options=OtherOptions, facts=facts)
            ]

    path = forge_config({"model": {"name": "broken"}, "data": {"packer": "none", "seq_len": 64}})
    with pytest.raises(
        ForgeError,
        match=r"model 'broken' \(plugin 'brokenplug'\): its facts function raised RuntimeError: boom",
    ):
        judge(path, [], 1, extra_plugins=(("brokenplug", Broken()),))


# --- what the strategies read from the implementation ---------------------------------------


class Tiny(torch.nn.Module):
    """Blocks in ``stack``; one block parameter and one root parameter outside any style."""

    def __init__(self, plan: TensorParallelPlan | None = None) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 4)
        self.stack = torch.nn.ModuleDict(
            {
                str(i): torch.nn.ModuleDict({"proj": torch.nn.Linear(4, 4), "norm": torch.nn.LayerNorm(4)})
                for i in range(2)
            }
        )
        self.head = torch.nn.Linear(4, 8, bias=False)
        self.scale = torch.nn.Parameter(torch.ones(1))
        self.plan = plan

    def parallel_contract(self):
        return ParallelContract(blocks="stack", tensor_parallel=lambda sequence_parallel: self.plan)


def test_blocks_come_from_the_contract_and_a_stage_copy_answers_too():
    from forge_plugins.parallel.pipeline import _shallow_copy

    model = Tiny()
    assert blocks_of(model) == list(model.stack.values())
    stage = _shallow_copy(model)
    stage.stack = torch.nn.ModuleDict({"1": model.stack["1"]})
    assert contract_of(stage).blocks == "stack" and blocks_of(stage) == [model.stack["1"]]
    plain = torch.nn.Module()
    plain.layers = torch.nn.ModuleList([torch.nn.Linear(1, 1)])
    assert contract_of(plain) is None and blocks_of(plain) == []


def test_coverage_names_what_the_plan_neither_shards_nor_declares():
    from forge_core.api.unstable import tensor_parallel_coverage

    def classify(model, blocks, plan):  # nothing applied: only what the plan declares counts
        return tensor_parallel_coverage(model, blocks, plan, lambda name, param: False)

    model = Tiny()
    plan = TensorParallelPlan(
        root=TensorParallelScope(styles={"embed": object(), "head": object()}, replicated=("scale",)),
        block=TensorParallelScope(styles={"proj": object()}, partial=("norm.weight",)),
    )
    # Nothing was applied (no process group): only what the plan declares is covered.
    uncovered, partial = classify(model, blocks_of(model), plan)
    assert partial == ["stack.0.norm.weight", "stack.1.norm.weight"]
    assert uncovered == [
        "embed.weight",
        "stack.0.proj.weight",
        "stack.0.proj.bias",
        "stack.0.norm.bias",
        "stack.1.proj.weight",
        "stack.1.proj.bias",
        "stack.1.norm.bias",
        "head.weight",
    ]
    # A root path never reaches into a block: "norm" at the root is not the blocks' norm.
    root_norm = attrs.evolve(plan, root=attrs.evolve(plan.root, replicated=("scale", "norm")))
    assert "stack.0.norm.bias" in classify(model, blocks_of(model), root_norm)[0]


def test_tied_parameters_are_found_by_identity_and_retied_when_placed_alike():
    from forge_core.api.unstable import tied_parameter_names as tied_names
    from forge_plugins.parallel.tensor import retie

    model = Tiny()
    model.head.weight = model.embed.weight
    groups = tied_names(model)
    assert groups == [["embed.weight", "head.weight"]]
    # A plan that replaced both (as sharding does) leaves two parameters: tied again.
    model.embed.weight = torch.nn.Parameter(model.embed.weight.detach().clone())
    model.head.weight = torch.nn.Parameter(model.head.weight.detach().clone())
    retie(model, groups, "tiny")
    assert model.head.weight is model.embed.weight
    assert len(list(model.parameters())) == len(
        {id(p) for _, p in model.named_parameters(remove_duplicate=False)}
    )


def test_tied_parameters_placed_differently_are_refused_naming_both():
    from forge_core.api.unstable import tied_parameter_names as tied_names
    from forge_plugins.parallel.tensor import retie

    model = Tiny()
    model.head.weight = model.embed.weight
    groups = tied_names(model)
    model.head.weight = torch.nn.Parameter(torch.zeros(4, 8))  # placed (shaped) differently
    with pytest.raises(ForgeError) as error:
        retie(model, groups, "tiny")
    message = str(error.value)
    assert "tied parameters of model 'tiny'" in message
    assert (
        "embed.weight: a plain tensor of shape (8, 4)" in message
        and "head.weight: a plain tensor of shape (4, 8)" in message
    )


def test_tensor_parallelism_refuses_a_model_without_a_plan():
    from forge_plugins.parallel.tensor import TensorParallel

    class Ctx:
        model_name = "plain"

    with pytest.raises(ForgeError, match="model 'plain' supplies no tensor-parallel plan"):
        TensorParallel(None).apply(torch.nn.Linear(2, 2), Ctx())


def test_pipeline_refuses_a_model_without_a_split():
    from forge_plugins.parallel.pipeline import split_of

    with pytest.raises(ForgeError, match="model 'tiny' .*its parallel contract has no pipeline split"):
        split_of(Tiny(), "tiny")
    with pytest.raises(ForgeError, match="model 'lin' .*it has no parallel_contract"):
        split_of(torch.nn.Linear(2, 2), "lin")


def test_the_llama_contract():
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import Llama
    from forge_plugins.models.options import LlamaOptions, llama_facts
    from forge_plugins.models.plugin import forge_models

    (spec,) = forge_models()
    assert spec.supports == {BLOCKS, TENSOR_PARALLEL, SEQUENCE_PARALLEL, PIPELINE, OUTPUT_HEAD}
    assert spec.facts is llama_facts
    model = Llama(LlamaOptions(dim=32, n_layers=2, n_heads=4, n_kv_heads=2), 16, SdpaAttention(None))
    contract = model.parallel_contract()
    assert blocks_of(model) == list(model.layers.values())
    assert contract.pipeline.first == ("tok_embeddings",) and contract.pipeline.last == ("norm", "output")
    assert contract.output_head == "output"
    for sequence_parallel in (False, True):
        # Every parameter of the llama is sharded or declared, with or without sequence
        # parallelism: names only, no process group needed.
        plan = contract.tensor_parallel(sequence_parallel=sequence_parallel)
        styled = {f"{path}." for path in plan.root.styles} | {
            f"layers.{k}.{path}." for k in model.layers for path in plan.block.styles
        }
        declared = set(plan.root.replicated) | {
            f"layers.{k}.{p}" for k in model.layers for p in plan.block.replicated
        }
        for name, _ in model.named_parameters():
            assert any(name.startswith(s) for s in styled) or any(
                name == d or name.startswith(d + ".") for d in declared
            ), (sequence_parallel, name)


def test_the_tp_strategy_hands_on_a_view_output_as_a_tensor_of_its_own():
    # DTensor.to_local() (the output head's use_local_output) is a view; FSDP warns on a
    # root module returning one. The hook keeps the storage and the gradient.
    from forge_plugins.parallel.tensor import own_output

    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    view = (x * 2).view_as(x)
    assert view._base is not None
    out = own_output(None, (), view)
    assert out._base is None and out.data_ptr() == view.data_ptr() and torch.equal(out, view)
    weights = torch.randn(2, 3, dtype=torch.float64)
    (out * weights).sum().backward()
    assert torch.equal(x.grad, 2 * weights)
    plain = x * 3
    assert own_output(None, (), plain) is plain  # not a view: untouched
