"""The kernel's ``parallelize`` in one process: strategies from the registry applied in
their declared order (compile, a declared wrapper, at 300), a strategy that splits the model, the
pipeline's stage split (stages chained give the whole model's logits) and gradient
clipping."""

from __future__ import annotations

import contextlib

import pytest
import torch

from forge_core.api import ModelSplit, ParallelContract, ParallelismSpec, hookimpl
from forge_core.config.blocks import resolve_components
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.distributed import parallelize as P
from forge_core.plan import make_plan
from forge_core.registry import load_registries
from forge_plugins.parallel import compile as compile_plugin

CALLS: list[str] = []
TINY = {"dim": 32, "n_layers": 5, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "max_seq_len": 16}


class Wrap:
    """A third-party wrapper that records when it is applied, to which module."""

    def __init__(self, options):
        pass

    def apply(self, model, ctx):
        CALLS.append(f"wrap:{type(model).__name__}")
        ctx.add_gradient_finisher(lambda: CALLS.append(f"finish:{type(model).__name__}"))
        return torch.nn.Sequential(model) if isinstance(model, torch.nn.Linear) else model


class Split:
    """Splits a Sequential into its children; finalize records what it was given."""

    def __init__(self, options):
        pass

    def apply(self, model, ctx):
        CALLS.append("split")

        def finalize(pmodel, runners):
            CALLS.append(f"finalize:{[type(r).__name__ for r in runners]}")
            pmodel.is_last_stage = False

        return ModelSplit(list(model.children()), finalize)


class Plugin:
    @hookimpl
    def forge_parallelisms(self):
        return [
            ParallelismSpec(name="early", summary="t", impl="test_parallelize:Split", order=100),
            ParallelismSpec(name="before", summary="t", impl="test_parallelize:Wrap", order=250),
            ParallelismSpec(name="after", summary="t", impl="test_parallelize:Wrap", order=350),
            ParallelismSpec(name="synced", summary="t", impl="test_parallelize:SyncingWrap", order=400),
        ]


def plan_with(registries, parallel, train=None):
    """The judged plan of a small config, in one process."""
    raw = {"model": {"name": "llama", "options": TINY}, "parallel": parallel, "train": train or {}}
    config, issues = structure(raw, ForgeConfig)
    assert not issues
    config, issues = resolve_components(config, registries)
    assert not issues, issues
    return make_plan(config, registries, 1)


@pytest.fixture
def registries():
    CALLS.clear()
    return load_registries(extra=(("order_test", Plugin()),))


def test_one_process_without_strategies_is_the_model_itself(registries):
    model = torch.nn.Linear(2, 2)
    pmodel = P.parallelize(model, plan_with(registries, {}), torch.device("cpu"))
    assert pmodel.parts == [model] and pmodel.forward is model
    assert (pmodel.dp_rank, pmodel.dp_size, pmodel.mesh, pmodel.train_step) == (0, 1, None, None)


def test_a_mesh_needs_as_many_processes_as_the_degrees_multiply_to():
    from forge_core.api import ForgeError
    from forge_core.distributed.mesh import build_mesh, dp_coords

    degrees = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}
    assert build_mesh(degrees, torch.device("cpu")) is None  # one process: no mesh at all
    assert dp_coords(None).size == 1
    with pytest.raises(ForgeError, match="tp=2 = 2 processes, but 1 are running"):
        build_mesh({**degrees, "tp": 2}, torch.device("cpu"))


@pytest.mark.parametrize(
    "parallel, train",
    [
        ({"wrappers": ["after", "before"]}, {"compile": True}),
        ({"wrappers": ["after", "compile", "before"]}, {}),
    ],
    ids=["train.compile", "parallel.wrappers"],
)
def test_strategies_apply_in_declared_order_with_compile_at_300(registries, monkeypatch, parallel, train):
    # compile is a declared wrapper of the registry (order 300), switched on by either
    # spelling; parallelize applies it like any other strategy.
    monkeypatch.setattr(compile_plugin, "compile_part", lambda module: CALLS.append("compile"))
    model = torch.nn.Linear(2, 2)
    plan = plan_with(registries, parallel, train)
    assert [s.name for s in plan.strategies] == ["before", "compile", "after"]
    pmodel = P.parallelize(model, plan, torch.device("cpu"))
    assert CALLS == ["wrap:Linear", "compile", "wrap:Sequential"]
    # The wrapper is what gets called; the part stays the unwrapped module.
    assert pmodel.parts == [model] and isinstance(pmodel.forward, torch.nn.Sequential)


def test_compile_is_off_unless_switched_on(registries):
    assert not plan_with(registries, {"wrappers": ["before"]}).is_active("compile")


def test_a_strategy_is_given_the_run_facts_it_needs_not_the_config(registries, monkeypatch):
    seen = []
    monkeypatch.setattr(Wrap, "apply", lambda self, model, ctx: seen.append(ctx) or model)
    plan = plan_with(registries, {"wrappers": ["before"]}, {"precision": "bf16"})
    P.parallelize(torch.nn.Linear(2, 2), plan, torch.device("cpu"))
    (ctx,) = seen
    assert (ctx.precision, ctx.model_name) == ("bf16", "llama")
    assert not hasattr(ctx, "config")  # a strategy's settings are its options


class SyncingWrap(Wrap):
    """A data-parallel-like wrapper that declares how it skips gradient sync."""

    def apply(self, model, ctx):
        @contextlib.contextmanager
        def sync(enabled):
            CALLS.append(f"sync:{enabled}")
            yield

        ctx.add_gradient_sync(sync)
        return model


class LooksLikeDDP(torch.nn.Module):
    """A model with a method named like DDP's: nothing may guess from the name."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3, 4))

    def forward(self, input_ids):
        return self.weight[input_ids]

    def no_sync(self):
        raise AssertionError("no_sync called on a module that declared no gradient sync")


def test_the_step_toggles_only_the_gradient_sync_a_strategy_declared(registries):
    from forge_core.train.step import optimizer_step

    def loss_fn(logits, labels):
        return logits.sum(), (labels != -100).sum()

    batch = {"input_ids": torch.tensor([[0, 1]]), "labels": torch.tensor([[1, 2]])}
    for wrappers, expected in ((["synced"], ["sync:False", "sync:False", "sync:True"]), ([], [])):
        CALLS.clear()
        model = LooksLikeDDP()
        pmodel = P.parallelize(
            model, plan_with(registries, {"wrappers": wrappers}), torch.device("cpu"), loss_fn
        )
        optimizer_step(
            pmodel,
            [torch.optim.SGD(model.parameters(), lr=0.1)],
            [batch] * 3,
            0.1,
            precision_name="fp32",
            device=torch.device("cpu"),
            slice_weight=1.0,
            grad_clip=0.0,
            stop=False,
            count_pairs=lambda batch: 0,
        )
        assert CALLS == expected


def test_gradient_finishers_registered_by_strategies_run_when_the_step_finishes(registries):
    model = torch.nn.Linear(2, 2)
    plan = plan_with(registries, {"wrappers": ["after", "before"]})
    pmodel = P.parallelize(model, plan, torch.device("cpu"))
    CALLS.clear()
    pmodel.finish_gradients()
    assert CALLS == ["finish:Linear", "finish:Sequential"]  # in the order the strategies ran


def test_a_split_model_gets_later_strategies_per_part_then_finalize(registries):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    plan = plan_with(registries, {"wrappers": ["early", "before"]})
    pmodel = P.parallelize(model, plan, torch.device("cpu"))
    assert CALLS == ["split", "wrap:Linear", "wrap:ReLU", "finalize:['Sequential', 'ReLU']"]
    assert pmodel.parts == list(model.children()) and pmodel.forward is None
    assert pmodel.is_last_stage is False


def test_compile_is_in_place_and_block_by_block(monkeypatch):
    # nn.Module.compile compiles in place (no OptimizedModule wrapper, whose "_orig_mod."
    # keys would break checkpoints); every block the model's contract names is compiled
    # on its own, and a model without a contract as a whole.
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(self))

    class Blocks(torch.nn.Module):
        def parallel_contract(self):
            return ParallelContract(blocks="stack")

    model = Blocks()
    model.stack = torch.nn.ModuleDict({"0": torch.nn.Linear(2, 2), "1": torch.nn.Linear(2, 2)})
    compile_plugin.compile_part(model)
    assert compiled == list(model.stack.values())
    plain = torch.nn.Module()
    plain.layers = torch.nn.ModuleDict(
        {"0": torch.nn.Linear(2, 2)}
    )  # a name means nothing without a contract
    compile_plugin.compile_part(plain)
    assert compiled[-1] is plain


def test_pipeline_stages_chained_equal_the_whole_model(registries):
    from forge_core import components
    from forge_plugins.parallel.pipeline import split_of, stage_module
    from forge_plugins.parallel.split import stage_layer_ranges

    plan = plan_with(registries, {})
    torch.manual_seed(0)
    model = components.model(plan, registries, 50, components.attention(plan, registries))
    ids = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        expected = model(ids)
        contract, blocks = split_of(model, "llama")
        keys = list(blocks.keys())
        ranges = stage_layer_ranges(len(keys), 3)
        stages = [
            stage_module(model, contract, [keys[i] for i in r], first=s == 0, last=s == 2)
            for s, r in enumerate(ranges)
        ]
        h = ids
        for stage in stages:
            h = stage(h)
    torch.testing.assert_close(h, expected, rtol=0, atol=0)
    assert [list(s.layers) for s in stages] == [["0", "1"], ["2", "3"], ["4"]]
    assert stages[0].norm is None and stages[1].tok_embeddings is None and stages[2].output is not None
    # Stage keys are the unsplit model's keys, each in exactly one stage.
    stage_keys = [k for s in stages for k in s.state_dict()]
    assert sorted(stage_keys) == sorted(model.state_dict()) and len(stage_keys) == len(set(stage_keys))
    assert model.norm is not None and len(model.layers) == 5  # the model itself is untouched


@pytest.mark.parametrize(("has_first", "has_last"), [(True, False), (False, True), (False, False)])
def test_pipeline_hands_every_stage_the_metadata_as_keyword_tensors(monkeypatch, has_first, has_last):
    """Every rank, whatever stages it holds, passes every batch key but input_ids and
    labels to schedule.step by keyword (torch splits them per microbatch); the inputs
    go only to the first stage, the labels only to the last."""
    from forge_plugins.parallel import pipeline
    from forge_plugins.parallel.pipeline import PipelineStep, _MicrobatchLoss

    calls = []

    class Schedule:
        def step(self, *args, **kwargs):
            calls.append((args, kwargs))

    monkeypatch.setattr(pipeline, "broadcast_sums", lambda result, group, src: (result[0], result[1]))
    loss = _MicrobatchLoss()
    step = PipelineStep(Schedule(), loss, 2, has_first, has_last, None, 1, torch.device("cpu"))
    batch = {
        "input_ids": torch.zeros(2, 4),
        "labels": torch.ones(2, 4),
        "doc_ids": torch.arange(8).view(2, 4),
        "positions": torch.arange(8).view(2, 4) % 3,
    }
    if has_last:  # the schedule would have called the loss once per microbatch
        loss.sums, loss.tokens = [torch.tensor(1.0)] * 2, [torch.tensor(3)] * 2
        monkeypatch.setattr(loss, "begin", lambda *a: None)
    step(batch, None, 1.0)
    ((args, kwargs),) = calls
    assert len(args) == (1 if has_first else 0)
    assert kwargs["doc_ids"] is batch["doc_ids"] and kwargs["positions"] is batch["positions"]
    assert ("target" in kwargs) == has_last and "input_ids" not in kwargs and "labels" not in kwargs


def test_clip_grad_norm_is_the_global_norm_and_clips():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model(torch.randn(3, 4)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    pmodel = P.single_process(model)
    norm = P.clip_grad_norm(pmodel, expected.item() / 4)
    torch.testing.assert_close(norm, expected)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g / 4, rtol=1e-5, atol=1e-7)
    assert P.clip_grad_norm(pmodel, 0.0) == pytest.approx(expected.item() / 4, rel=1e-5)
